"""``inspect --plot``: PNG and SVG files written, opened back, of the right size and not blank."""

from __future__ import annotations

import base64
import io
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ramstream.api import probe
from ramstream.cli import main
from ramstream.config import RunOptions
from tests.families import DEFAULT_SHAPES, build_family

pytest.importorskip("matplotlib")
from matplotlib import image as mpimg

TENSOR = "model.layers.0.mlp.down_proj.weight"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shapes = {**DEFAULT_SHAPES, TENSOR: (48, 2048)}  # wide enough for whole-byte columns
    family = build_family(tmp_path_factory.mktemp("family"), shapes=shapes, seed=5)
    path = tmp_path_factory.mktemp("idx") / "index.zarr"
    probe(family.base, [str(a) for a in family.agents], index=path, options=RunOptions(block_elems=512, quiet=True))
    return path


def plot(index: Path, target: Path, *args: str) -> None:
    result = CliRunner().invoke(main, ["inspect", str(index), "--plot", str(target), *args])
    assert result.exit_code == 0, result.output
    assert result.output.rstrip().endswith(f"plot: {target}")


def png_pixels(path: Path) -> np.ndarray:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return np.asarray(mpimg.imread(path))


def assert_not_blank(rgb: np.ndarray, min_colors: int) -> None:
    """Much of the picture is not background, and it has many colours (bars, heatmaps, text)."""
    pixels = rgb[..., :3].reshape(-1, 3)
    assert np.mean(np.any(pixels < 0.95, axis=1)) > 0.15
    assert colours(pixels) >= min_colors


def colours(pixels: np.ndarray) -> int:
    rgb = np.round(pixels.reshape(-1, 3) * 255).astype(np.uint32)
    return len(np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2]))


@pytest.mark.parametrize("by", [(), ("--by", "layer"), ("--by", "module")])
def test_summary_png(index: Path, tmp_path: Path, by: tuple[str, ...]) -> None:
    target = tmp_path / "summary.png"
    plot(index, target, *by)
    pixels = png_pixels(target)
    height, width = pixels.shape[:2]
    assert width >= 1000 and height >= 800  # 10 x 8 inches or more at 100 dpi
    assert_not_blank(pixels, 50)
    # the four panels: a density bar chart, the overlap histogram, two heatmaps; the heatmaps
    # (bottom half) carry the viridis colours
    assert colours(pixels[height // 2 :, :, :3]) >= 20


def test_summary_svg(index: Path, tmp_path: Path) -> None:
    target = tmp_path / "summary.svg"
    plot(index, target, "--by", "layer")
    root = ET.parse(target).getroot()
    assert root.tag == f"{SVG}svg"
    assert float(root.attrib["width"].removesuffix("pt")) >= 700
    assert float(root.attrib["height"].removesuffix("pt")) >= 500
    assert len(root.findall(f".//{SVG}path")) >= 20  # bars, axes, ticks, text
    images = root.findall(f".//{SVG}image")
    assert len(images) >= 2  # the two heatmaps, embedded as PNG
    for element in images:
        href = element.attrib.get("{http://www.w3.org/1999/xlink}href") or element.attrib["href"]
        data = base64.b64decode(href.split(",", 1)[1])
        heatmap = np.asarray(mpimg.imread(io.BytesIO(data), format="png"))
        assert heatmap.size > 0 and np.ptp(heatmap[..., :3]) > 0.2


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_tensor_image(index: Path, tmp_path: Path, suffix: str) -> None:
    target = tmp_path / f"tensor{suffix}"
    plot(index, target, "--tensor", TENSOR)
    if suffix == ".png":
        pixels = png_pixels(target)
        height, width = pixels.shape[:2]
        assert width >= 1200 and height >= 300  # one panel per agent and one for overlaps
        assert_not_blank(pixels, 30)
        dark = np.mean(pixels[..., :3].sum(axis=-1) < 0.3)  # low densities: the colormap's dark end
        assert dark > 0.02
    else:
        root = ET.parse(target).getroot()
        assert root.tag == f"{SVG}svg" and len(root.findall(f".//{SVG}image")) >= 4


def test_plot_and_json_together(index: Path, tmp_path: Path) -> None:
    target = tmp_path / "s.png"
    result = CliRunner().invoke(main, ["inspect", str(index), "--json", "--plot", str(target)])
    assert result.exit_code == 0 and result.output.startswith("{")
    assert target.stat().st_size > 10_000
