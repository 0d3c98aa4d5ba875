"""Plain-text tables for ``ramstream inspect`` (the JSON document has the same numbers)."""

from __future__ import annotations

from typing import Any


def _human(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _rho(x: float | str) -> str:
    return "inf" if x == "inf" else f"{float(x):.4g}"


def group_table(title: str, rows: list[dict[str, Any]], agents: list[str]) -> str:
    """One line per row: params, the share of elements two agents or more changed, and per
    agent its density and unique share (``density/unique-share``)."""
    width = max([len(title), *(len(r["key"]) for r in rows)]) + 2
    head = f"{title:<{width}}{'params':>9} {'collide':>8}" + "".join(f" {a[:20]:>20}" for a in agents)
    sub = " " * (width + 18) + "".join(f" {'density/uniq-share':>20}" for _ in agents)
    lines = [head, sub]
    for r in rows:
        cells = "".join(f" {a['density']:>9.4f}/{a['unique_share']:<10.4f}" for a in r["agents"])
        lines.append(f"{r['key']:<{width}}{_human(r['params']):>9} {r['collide']:>8.4f}{cells}".rstrip())
    return "\n".join(lines)


def top_table(top: dict[str, Any]) -> str:
    lines = []
    for agent in top["agents"]:
        lines.append(f"top {top['k']} tensors of {agent['name']} by {top['rank_by']}:")
        width = max([6, *(len(t["key"]) for t in agent["tensors"])]) + 2
        lines.append(
            f"  {'tensor':<{width}}{'params':>9} {'active':>12} {'density':>8} {'unique':>12} {'uniq-share':>10}"
        )
        for t in agent["tensors"]:
            lines.append(
                f"  {t['key']:<{width}}{_human(t['params']):>9} {t['active']:>12} {t['density']:>8.4f} "
                f"{t['unique']:>12} {t['unique_share']:>10.4f}"
            )
        if not agent["tensors"]:
            lines.append("  (this agent changed no element)")
    return "\n".join(lines)


def tensor_table(entry: dict[str, Any]) -> str:
    shape = "x".join(str(s) for s in entry["shape"]) or "scalar"
    where = f"layer {entry['layer']}" if entry["layer"] is not None else "outside the layers"
    lines = [
        f"tensor {entry['key']}  {shape} ({', '.join(entry['dtypes'])})  {where}, module {entry['module']} "
        f"({entry['kind']}), {entry['params']} elements in {entry['blocks']} blocks",
        f"elements changed by exactly k agents (k = 0..N): {entry['coverage']}",
        f"{'agent':<16}{'active':>12} {'density':>8} {'shared':>12} {'unique':>12} {'uniq-share':>10} "
        f"{'rho':>8} {'lambda*':>9}  overlap",
    ]
    for a in entry["agents"]:
        lines.append(
            f"{a['name'][:16]:<16}{a['active']:>12} {a['density']:>8.4f} {a['shared']:>12} {a['unique']:>12} "
            f"{a['unique_share']:>10.4f} {_rho(a['rho']):>8} {a['lambda']:>9.5f}  {a['overlap_histogram']}"
        )
    lines.append("* lambda with rho of this tensor alone (--rho-scope tensor)")
    return "\n".join(lines)


def _pair_cells(p: dict[str, Any]) -> str:
    share = f"{p['both_share'][0]:.4f}/{p['both_share'][1]:.4f}"
    return (
        f"{_human(p['both']):>9} {share:>15} {p['sign_agreement']:>9.4f} {p['cosine']:>8.4f} "
        f"{_rho(p['magnitude_ratio']):>9}"
    )


PAIR_HEAD = f"{'both':>9} {'both/active i/j':>15} {'same-sign':>9} {'cosine':>8} {'|i|/|j|':>9}"


def pair_tables(section: dict[str, Any]) -> str:
    """The model's row per pair, then for each grouping a table per pair (rows: its groups), and
    the agents' unique energy shares (sum tau^2 over unique elements / over active ones)."""
    model = section["model"]
    title = "pair (over the elements both changed)"
    width = max([len(title), *(len(" ~ ".join(p["agents"])) for p in model["pairs"])]) + 2
    lines = [f"{title:<{width}}{PAIR_HEAD}"]
    lines += [f"{' ~ '.join(p['agents']):<{width}}{_pair_cells(p)}" for p in model["pairs"]]
    if not model["pairs"]:
        lines.append("(one agent: no pairs)")
    energy = [
        "agent unique energy share: "
        + ", ".join(f"{a['name']} {a['unique_energy_share']:.4f}" for a in model["agents"])
    ]
    parts = ["\n".join(lines), "\n".join(energy)]
    for key, title in (("layers", "layer"), ("modules", "module"), ("tensors", "tensor")):
        rows = section.get(key)
        if rows is None:
            continue
        width = max([len(title), *(len(r["key"]) for r in rows)]) + 2
        for p, pair in enumerate(model["pairs"]):
            table = [f"{' ~ '.join(pair['agents'])} by {title}", f"{title:<{width}}{PAIR_HEAD}"]
            table += [f"{r['key']:<{width}}{_pair_cells(r['pairs'][p])}" for r in rows]
            parts.append("\n".join(table))
        names = [a["name"] for a in model["agents"]]
        table = [f"unique energy share by {title}", f"{title:<{width}}" + "".join(f" {n[:12]:>12}" for n in names)]
        table += [
            f"{r['key']:<{width}}" + "".join(f" {a['unique_energy_share']:>12.4f}" for a in r["agents"]) for r in rows
        ]
        parts.append("\n".join(table))
    return "\n\n".join(parts)


def render(doc: dict[str, Any], summary: str) -> str:
    """The text of ``inspect``: the per-agent summary, then each section asked for."""
    agents = [a["name"] for a in doc["agents"]]
    parts = [summary]
    for key, title in (("layers", "layer"), ("modules", "module"), ("tensors", "tensor")):
        if key in doc:
            parts.append(group_table(title, doc[key], agents))
    if "pairs" in doc:
        parts.append(pair_tables(doc["pairs"]))
    if "top" in doc:
        parts.append(top_table(doc["top"]))
    if "tensor" in doc:
        parts.append(tensor_table(doc["tensor"]))
    return "\n\n".join(parts)
