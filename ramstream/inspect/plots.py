"""Figures of an index (matplotlib, an optional extra; rendered with the Agg / SVG canvases).

- ``summary_figure``: density per agent; each agent's overlap histogram (the share of its
  changed elements that 0, 1, ... other agents also changed, as in the paper's Figure 2); and
  heatmaps of density and unique share per layer (or module) x agent.
- ``tensor_figure``: which agents change which elements of one tensor, downsampled: per agent
  the fraction of each cell's elements it changed, and the fraction two or more agents changed.
- ``pairs_figure``: pair x layer (or module) heatmaps of the cosine and of the sign agreement
  over the elements both agents changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ramstream.errors import ConfigError, OutputError
from ramstream.inspect.extras import require
from ramstream.inspect.masks import MaskImage
from ramstream.inspect.pairs import PairTable
from ramstream.inspect.tables import Table

FORMATS = (".png", ".svg")


def new_figure(width: float, height: float) -> Any:
    """A matplotlib figure on the Agg canvas (no display needed); matplotlib missing is one line."""
    require("matplotlib", "plot")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def check_target(path: Path) -> None:
    """Refuse a plot file the figure cannot be written to, before any work is done."""
    if path.suffix.lower() not in FORMATS:
        raise ConfigError(f"{path}: --plot writes PNG or SVG; name the file *.png or *.svg")
    if not path.parent.is_dir():
        raise OutputError(f"{path}: the directory {path.parent} does not exist")
    require("matplotlib", "plot")


def save(figure: Any, path: Path) -> None:
    """Write the figure; an SVG keeps its text as text (searchable, and smaller than glyph paths)."""
    import matplotlib

    check_target(path)
    try:
        with matplotlib.rc_context({"svg.fonttype": "none"}):
            figure.savefig(path, format=path.suffix.lower()[1:])
    except OSError as exc:
        raise OutputError(f"{path}: cannot write the plot ({exc.strerror or exc})") from exc


def _heatmap(
    figure: Any, ax: Any, values: np.ndarray, rows: tuple[str, ...], agents: tuple[str, ...], title: str
) -> None:
    image = ax.imshow(values, aspect="auto", cmap="viridis", vmin=0.0, vmax=max(float(values.max(initial=0)), 1e-12))
    ax.set_title(title)
    ax.set_xticks(range(len(agents)), agents, rotation=30, ha="right")
    step = max(1, len(rows) // 40)
    ax.set_yticks(range(0, len(rows), step), rows[::step], fontsize=7)
    figure.colorbar(image, ax=ax, shrink=0.8)


def summary_figure(model: Table, groups: Table) -> Any:
    """The per-agent bars and the ``groups`` (layers or modules) x agent heatmaps."""
    agents = model.agents
    n = len(agents)
    figure = new_figure(max(10.0, 1.6 * n + 6), 4.0 + max(4.0, 0.16 * len(groups)))
    top, bottom = figure.subfigures(2, 1, height_ratios=[1.0, max(1.0, len(groups) / 25)])
    ax_density, ax_hist = top.subplots(1, 2)
    x = np.arange(n)
    ax_density.bar(x, model.density[0], color="tab:blue")
    ax_density.set_xticks(x, agents, rotation=30, ha="right")
    ax_density.set_ylabel("changed elements / params")
    ax_density.set_title("density per agent")
    shares = model.overlap[0] / np.maximum(model.active[0], 1)[:, None]
    bottom_edge = np.zeros(n)
    colors = [_cmap_color(k, n) for k in range(n)]
    for k in range(n):
        label = "unique" if k == 0 else f"+{k} other{'s' if k > 1 else ''}"
        ax_hist.bar(x, shares[:, k], bottom=bottom_edge, color=colors[k], label=label)
        bottom_edge += shares[:, k]
    ax_hist.set_xticks(x, agents, rotation=30, ha="right")
    ax_hist.set_ylim(0, 1)
    ax_hist.set_ylabel("share of the agent's changed elements")
    ax_hist.set_title("overlap: how many other agents changed them too")
    ax_hist.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax_d, ax_u = bottom.subplots(1, 2)
    _heatmap(bottom, ax_d, groups.density, groups.keys, agents, f"density per {groups.by}")
    _heatmap(bottom, ax_u, groups.unique_share, groups.keys, agents, f"unique share per {groups.by}")
    return figure


def _cmap_color(k: int, n: int) -> Any:
    from matplotlib import colormaps

    return colormaps["viridis"](k / max(n - 1, 1))


def tensor_figure(image: MaskImage) -> Any:
    n = len(image.agents)
    height, width = image.cells.shape
    aspect = height / max(width, 1)
    panel_w = 3.2
    figure = new_figure(panel_w * (n + 1) + 1.0, max(2.2, min(panel_w * aspect, 8.0)) + 1.2)
    axes = figure.subplots(1, n + 1, squeeze=False)[0]
    panels = [*image.density, image.collide_density]
    titles = [*image.agents, "2+ agents"]
    mappable = None
    for ax, values, title in zip(axes, panels, titles, strict=True):
        mappable = ax.imshow(values, aspect="auto", cmap="magma", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    shape = "x".join(str(s) for s in image.shape) or "scalar"
    figure.suptitle(f"{image.tensor} ({shape}): share of changed elements per cell ({height}x{width} cells)")
    figure.colorbar(mappable, ax=list(axes), shrink=0.8)
    return figure


def pairs_figure(groups: PairTable) -> Any:
    """Two heatmaps, pairs (rows) x groups (columns): cosine in [-1, 1], sign agreement in [0, 1];
    a cell where the two agents share no element is left blank."""
    if not groups.pairs:
        raise ConfigError("--pairs --plot needs two agents or more: an index of one agent has no pairs")
    names = groups.pair_names
    width = max(8.0, min(0.25 * len(groups) + 4.0, 30.0))
    height = 1.6 + 0.3 * len(names)
    figure = new_figure(width, 2 * height + 0.6)
    panels = (
        (groups.cosine, "coolwarm", -1.0, f"cosine over shared elements, per {groups.by}"),
        (groups.sign_agreement, "viridis", 0.0, f"sign agreement over shared elements, per {groups.by}"),
    )
    step = max(1, len(groups) // 60)
    for ax, (values, cmap, low, title) in zip(figure.subplots(2, 1), panels, strict=True):
        shown = np.ma.masked_where(groups.both.T == 0, values.T)
        image = ax.imshow(shown, aspect="auto", cmap=cmap, vmin=low, vmax=1.0, interpolation="nearest")
        ax.set_title(title)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.set_xticks(range(0, len(groups), step), groups.keys[::step], rotation=60, ha="right", fontsize=7)
        figure.colorbar(image, ax=ax, shrink=0.9)
    return figure
