"""The output's README.md: a Hugging Face model card recording the method, its parameters, the
agents (with their overlap statistics when the merge used the index) and the inputs; for a stack
of layers (passthrough), its slices instead of agents (``stack_card``).

Its front matter lists the members known by a hub repo id under ``base_model`` with
``base_model_relation: merge``, as mergekit's cards do, so the hub draws the model tree; a local
directory's name means nothing on the hub and is left out (a merge of local checkpoints only has
no ``base_model``). The front matter is dumped by ``yaml.safe_dump``. Names are the user's
(directory and file names, repo ids): in the text they are written on one line with Markdown's
special characters escaped, so a ``|`` or a newline cannot split a table row, and characters a
UTF-8 file cannot hold (a file name's undecodable bytes) are written as escapes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import yaml

from ramstream.format.checkpoint import Checkpoint
from ramstream.format.family import Family
from ramstream.methods.report import AgentReport
from ramstream.version import __version__

# ASCII punctuation that Markdown (and a table's cell borders) would read as syntax.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|~&#!])")


def model_card(family: Family, record: dict[str, Any], reports: list[AgentReport]) -> str:
    lines = [
        *front_matter(family.members),
        f"# Merge of {len(family.agents)} agents into {text(family.base.name)}",
        "",
        f"Made with ramstream {__version__}, method {code(record['method'])}.",
        "",
        *_missing(record),
        *_quantized(family, record),
        "## Parameters",
        "",
        "```json",
        json.dumps({"method": record["method"], "eps": record["eps"], **record["params"]}, indent=2),
        "```",
        "",
        "## Agents",
        "",
        *_agents_table(record, reports),
        "",
        "## Inputs",
        "",
        *_inputs(record),
    ]
    return "\n".join(lines) + "\n"


def stack_card(members: Sequence[Checkpoint], record: dict[str, Any]) -> str:
    """The card of a stack of layers (passthrough): its slices, in output order, and the inputs."""
    slices = record["slices"]
    layers = sum(s["layers"][1] - s["layers"][0] for s in slices)
    lines = [
        *front_matter(members),
        f"# Stack of {layers} layers from {len(slices)} slice{'s' * (len(slices) != 1)}",
        "",
        f"Made with ramstream {__version__}, method {code('passthrough')}: layers copied, not merged "
        f"(embeddings from the first slice's model, final norm and head from the last's).",
        "",
        *_missing(record),
        "## Slices",
        "",
        _row(["slice", "model", "layers", "output layers", "scale"]),
        "|---:|---|---|---|---|",
    ]
    for k, s in enumerate(slices):
        (start, end), first = s["layers"], s["output_start"]
        scale = "none" if s["scale"] is None else json.dumps(s["scale"])
        lines.append(_row([k, s["model"], f"{start}-{end - 1}", f"{first}-{first + end - start - 1}", scale]))
    lines += ["", "## Parameters", "", "```json", json.dumps(record["params"], indent=2), "```", ""]
    lines += ["## Inputs", "", *_inputs(record)]
    return "\n".join(lines) + "\n"


def _quantized(family: Family, record: dict[str, Any]) -> list[str]:
    """A line saying which members are stored quantized and how the output is written."""
    lines = []
    for role, member in [("base", family.base), *(("agent", a) for a in family.agents)]:
        if member.scheme is not None:
            read_as = "dequantized to float32"
            if role == "base" and family.quantized_base_as != "f32":
                dtype = family.quantized_base_as
                read_as += f", then rounded to {dtype} as its {dtype} conversion holds them (`--quantized-base-as`)"
            lines.append(
                f"The {role} {text(member.name)} is stored quantized ({text(member.scheme.summary)}): its quantized "
                f"tensors were read {read_as}."
            )
    if family.base.scheme is not None and record["run"]["out_dtype"] == "fp8":
        lines.append(
            "The merged tensors the base stores quantized are written in its scheme, their scales recomputed "
            "from the merged values (one per block, channel or tensor, as the base has them, with the base's "
            "names, dtypes and shapes), and config.json keeps its `quantization_config`."
        )
    elif family.base.scheme is not None:
        out = record["run"]["out_dtype"]
        lines.append(
            f"The merged tensors are written in {'bf16' if out == 'auto' else out}, so the base's "
            "`quantization_config` is dropped from config.json."
        )
    return [" ".join(lines), ""] if lines else []


def _inputs(record: dict[str, Any]) -> list[str]:
    lines = []
    for fp in record["inputs"]:
        name = code(fp["name"])
        hub = fp.get("hub", {})
        if hub:
            lines.append(f"- {name}: Hugging Face {code(hub['repo_id'])} at commit {code(hub['commit'])}")
        blobs = hub.get("blobs", {})
        for f in fp["files"]:
            blob = f", cached blob {code(blobs[f['file']])}" if f["file"] in blobs else ""
            digest = f"header sha256 `{f['header_sha256']}`" if "header_sha256" in f else f"sha256 `{f['sha256']}`"
            lines.append(f"- {name}: {code(f['file'])}, {f['size']} bytes, {digest}{blob}")
    return lines


def front_matter(members: Sequence[Checkpoint]) -> list[str]:
    """The card's YAML header: the members' hub repo ids (only those) and the tags."""
    repos = list(dict.fromkeys(m.hub.repo_id for m in members if m.hub is not None))
    header: dict[str, Any] = {"base_model": repos, "base_model_relation": "merge"} if repos else {}
    header |= {"library_name": "transformers", "tags": ["merge", "ramstream"]}
    return ["---", *yaml.safe_dump(header, sort_keys=False, allow_unicode=False).splitlines(), "---"]


def text(name: object) -> str:
    """``name`` as Markdown text on one line, its special characters escaped."""
    return _one_line(_MARKDOWN.sub(r"\\\1", str(name)))


def code(name: object) -> str:
    """``name`` as a Markdown code span on one line (fenced by more backticks than it holds)."""
    content = _one_line(str(name))
    fence = "`" * (max((len(run) for run in re.findall("`+", content)), default=0) + 1)
    pad = " " if content.startswith("`") or content.endswith("`") else ""
    return f"{fence}{pad}{content}{pad}{fence}"


def _one_line(value: str) -> str:
    """Line breaks shown as ``\\n``, and lone surrogates (undecodable bytes of a file name) as
    escapes a UTF-8 file can hold (``\\xe9``)."""
    value = value.replace("\r", "\\r").replace("\n", "\\n")
    try:
        raw = value.encode("utf-8", "surrogateescape")  # a file name's undecodable bytes, as they were
    except UnicodeEncodeError:
        raw = value.encode("utf-8", "backslashreplace")  # other lone surrogates (from a JSON header)
    return raw.decode("utf-8", "backslashreplace")


def _row(cells: list[object]) -> str:
    return "| " + " | ".join(text(c) for c in cells) + " |"


def _agents_table(record: dict[str, Any], reports: list[AgentReport]) -> list[str]:
    values = record["per_agent"]
    if reports:
        lines = [_row(["agent", "active", "density", "unique", "shared", "rho", *values])]
        lines.append("|---|---:|---:|---:|---:|---:|" + "---:|" * len(values))
        for t, rep in enumerate(reports):
            cells = [rep.name, rep.active, f"{rep.density:.4f}", rep.unique, rep.shared, f"{rep.rho:.4g}"]
            lines.append(_row([*cells, *(f"{v[t]:.6g}" for v in values.values())]))
        return lines
    lines = [_row(["agent", *values]), "|---|" + "---:|" * len(values)]
    for t, name in enumerate(record["agents"]):
        lines.append(_row([name, *(f"{v[t]:.6g}" for v in values.values())]))
    return lines


def _missing(record: dict[str, Any]) -> list[str]:
    """A note on what the directory lacks to load with transformers, when it lacks something."""
    missing = record.get("missing") or []
    if not missing:
        return []
    what = " and no ".join(missing)
    because = text(record.get("missing_because", "the base has none"))
    return [
        f"**Not a complete model directory**: it has no {what} ({because}); add them before loading it with "
        "transformers.",
        "",
    ]
