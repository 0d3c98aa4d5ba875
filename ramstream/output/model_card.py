"""The output's README.md: a Hugging Face model card recording the method, its parameters, the
agents (with their overlap statistics when the merge used the index) and the inputs.

Its front matter names the base and the agents under ``base_model`` (by hub repo id where one is
known, else by name) with ``base_model_relation: merge``, as mergekit's cards do, so the hub
draws the model tree."""

from __future__ import annotations

import json
from typing import Any

from ramstream.format.family import Family
from ramstream.methods.report import AgentReport
from ramstream.version import __version__


def model_card(family: Family, record: dict[str, Any], reports: list[AgentReport]) -> str:
    lines = [
        *front_matter(family),
        f"# Merge of {len(family.agents)} agents into {family.base.name}",
        "",
        f"Made with ramstream {__version__}, method `{record['method']}`.",
        "",
        "## Parameters",
        "",
        "```json",
        json.dumps({"method": record["method"], "eps": record["eps"], **record["params"]}, indent=2),
        "```",
        "",
        "## Agents",
        "",
    ]
    values = record["per_agent"]
    if reports:
        lines += ["| agent | active | density | unique | shared | rho | " + " | ".join(values) + " |"]
        lines += ["|---|---:|---:|---:|---:|---:|" + "---:|" * len(values)]
        for t, rep in enumerate(reports):
            cells = [rep.name, rep.active, f"{rep.density:.4f}", rep.unique, rep.shared, f"{rep.rho:.4g}"]
            cells += [f"{v[t]:.6g}" for v in values.values()]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    else:
        lines += ["| agent | " + " | ".join(values) + " |", "|---|" + "---:|" * len(values)]
        for t, name in enumerate(record["agents"]):
            lines.append("| " + " | ".join([name, *(f"{v[t]:.6g}" for v in values.values())]) + " |")
    lines += ["", "## Inputs", ""]
    for fp in record["inputs"]:
        hub = fp.get("hub", {})
        if hub:
            lines.append(f"- `{fp['name']}`: Hugging Face `{hub['repo_id']}` at commit `{hub['commit']}`")
        blobs = hub.get("blobs", {})
        for f in fp["files"]:
            blob = f", cached blob `{blobs[f['file']]}`" if f["file"] in blobs else ""
            lines.append(
                f"- `{fp['name']}`: `{f['file']}`, {f['size']} bytes, header sha256 `{f['header_sha256']}`{blob}"
            )
    return "\n".join(lines) + "\n"


def front_matter(family: Family) -> list[str]:
    """The card's YAML header; names are written as JSON strings (valid YAML, whatever they hold)."""
    names = [m.hub.repo_id if m.hub is not None else m.name for m in family.members]
    return [
        "---",
        "base_model:",
        *(f"- {json.dumps(n)}" for n in dict.fromkeys(names)),
        "base_model_relation: merge",
        "library_name: transformers",
        "tags:",
        "- merge",
        "- ramstream",
        "---",
    ]
