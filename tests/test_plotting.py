"""Plotting: the numpy colour map, scaling, tiling and line chart; matplotlib stays optional."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinyattn.analysis.plotting import (
    CHART_MARGIN,
    GRID_RGB,
    LINE_RGB,
    MASKED_RGB,
    VIRIDIS,
    PlottingUnavailable,
    colormap,
    line_chart,
    plotting_available,
    require_matplotlib,
    scale_up,
    tile,
)

ROOT = Path(__file__).resolve().parents[1]


def test_colormap_maps_the_ends_of_the_range_to_the_ends_of_the_table_and_nan_to_grey():
    values = np.array([[0.0, 1.0], [np.nan, -0.5], [2.0, 0.5]])
    image = colormap(values, 0.0, 1.0)
    assert image.shape == (3, 2, 3) and image.dtype == np.uint8
    assert tuple(image[0, 0]) == VIRIDIS[0] and tuple(image[0, 1]) == VIRIDIS[-1]
    assert tuple(image[1, 0]) == MASKED_RGB
    assert tuple(image[1, 1]) == VIRIDIS[0] and tuple(image[2, 0]) == VIRIDIS[-1]  # clipped
    assert tuple(image[2, 1]) == VIRIDIS[len(VIRIDIS) // 2]  # 0.5 is the middle stop
    assert MASKED_RGB not in VIRIDIS
    assert tuple(colormap(np.array([5.0]), 4.0, 6.0)[0]) == VIRIDIS[len(VIRIDIS) // 2]


def test_colormap_is_within_6_levels_of_matplotlibs_viridis():
    matplotlib = pytest.importorskip("matplotlib")
    values = np.linspace(0.0, 1.0, 1001)
    reference = matplotlib.colormaps["viridis"](values)[:, :3] * 255
    difference = np.abs(colormap(values).astype(float) - reference)
    assert difference.max() <= 6.0


def test_scale_up_makes_every_pixel_a_square_block():
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    big = scale_up(image, 4)
    assert big.shape == (8, 12, 3)
    for r in range(2):
        for c in range(3):
            assert np.all(big[4 * r:4 * r + 4, 4 * c:4 * c + 4] == image[r, c])
    assert scale_up(image, 1).shape == image.shape


def test_tile_places_cells_row_by_row_with_gaps_of_the_gap_colour():
    cells = [np.full((3, 5, 3), n * 40, dtype=np.uint8) for n in range(1, 4)]  # three 3x5 cells
    grid = tile(cells, columns=2, gap=2, gap_color=(1, 2, 3))
    assert grid.shape == (2 * 3 + 2, 2 * 5 + 2, 3)
    assert np.all(grid[0:3, 0:5] == 40) and np.all(grid[0:3, 7:12] == 80)  # row 0
    assert np.all(grid[5:8, 0:5] == 120)  # row 1, column 0
    assert np.all(grid[0:3, 5:7] == (1, 2, 3)) and np.all(grid[3:5, :] == (1, 2, 3))  # gaps
    assert np.all(grid[5:8, 5:12] == (1, 2, 3))  # the empty fourth place


def test_line_chart_draws_the_curve_where_the_data_puts_it_and_the_grid_at_its_values():
    width, height, m = 105, 57, CHART_MARGIN  # a plot of 93 x 45 pixels: whole-pixel positions
    plot_w, plot_h = width - 2 * m, height - 2 * m
    x = np.array([0.0, 1.0, 2.0])
    y = np.array([4.0, 2.0, 2.0])  # falls, then flat
    image = line_chart(x, y, width, height, (0.0, 4.0), x_grid=[1.0], y_grid=[0.0, 3.0])
    assert image.shape == (height, width, 3) and image.dtype == np.uint8
    line = np.all(image == LINE_RGB, axis=-1)  # (height, width)

    def row_of(value):
        return round(m + (4.0 - value) / 4.0 * (plot_h - 1))

    assert line[row_of(4.0), m] and line[row_of(2.0), width - m - 1]  # the two ends
    assert line[row_of(3.0), m + round((plot_w - 1) / 4)]  # half way down the falling part
    # The falling stretch is joined: every row between its ends is drawn somewhere.
    assert all(line[r, m:m + plot_w].any() for r in range(row_of(4.0), row_of(2.0) + 1))
    assert not line[:m].any() and not line[:, :m].any()  # nothing in the margin
    grid = np.all(image == GRID_RGB, axis=-1)
    assert grid[row_of(0.0), m:m + plot_w].all()  # y = 0: the bottom row of the plot
    assert grid[row_of(3.0), width - m - 1]
    assert grid[m:m + 10, m + round((plot_w - 1) / 2)].all()  # x = 1, above the curve
    assert np.all(image[0] == 255)  # white margin


def test_line_chart_draws_no_grid_line_for_a_value_outside_its_range():
    # A grid value past the plot would otherwise be clipped onto its edge, a line at a value not there.
    x, y = np.array([0.0, 1.0]), np.array([np.nan, np.nan])  # no curve: only the grid could be drawn
    image = line_chart(x, y, 60, 40, (0.0, 1.0), x_grid=[-1.0, 2.0], y_grid=[-0.5, 1.5])
    assert not np.all(image == GRID_RGB, axis=-1).any()


def test_line_chart_draws_values_beyond_its_range_on_the_edge_of_the_plot():
    x = np.arange(3.0)
    for beyond, edge in ((-5.0, 0.0), (9.0, 4.0)):  # below the range: the bottom; above: the top
        np.testing.assert_array_equal(line_chart(x, np.full(3, beyond), 60, 30, (0.0, 4.0)),
                                      line_chart(x, np.full(3, edge), 60, 30, (0.0, 4.0)))

def test_line_chart_keeps_a_curve_on_the_bottom_of_its_range_inside_the_plot_two_pixels_thick():
    width, height, m = 60, 30, CHART_MARGIN
    for level in (0.0, -5.0, 4.0):  # the bottom, below it (drawn on it), the top
        line = np.all(line_chart(np.arange(3.0), np.full(3, level), width, height, (0.0, 4.0)) == LINE_RGB,
                      axis=-1)
        rows = np.flatnonzero(line.any(axis=1))
        assert rows.min() >= m and rows.max() <= height - m - 1, (level, rows)  # not in the margin
        assert (line[:, m:width - m].sum(axis=0) == 2).all(), level  # two pixels in every column


def test_line_chart_spans_its_x_values_wherever_they_start():
    y = np.array([4.0, 2.0, 2.0])
    at_zero = line_chart(np.array([0.0, 1.0, 2.0]), y, 60, 30, (0.0, 4.0))
    np.testing.assert_array_equal(line_chart(np.array([10.0, 11.0, 12.0]), y, 60, 30, (0.0, 4.0)), at_zero)

def test_line_chart_skips_nan_values():
    y = np.array([1.0, np.nan, 1.0, np.nan])
    image = line_chart(np.arange(4.0), y, 60, 30, (0.0, 2.0))
    line = np.all(image == LINE_RGB, axis=-1)
    assert line.any(axis=0)[CHART_MARGIN:CHART_MARGIN + 32].all()  # joined across the gap at x = 1
    assert not line.any(axis=0)[-CHART_MARGIN - 10:].any()  # nothing after x = 2, the last number
    assert np.all(line_chart(np.arange(2.0), np.full(2, np.nan), 60, 30, (0.0, 2.0)) == 255)


def test_missing_matplotlib_is_a_one_line_error_saying_how_to_install(monkeypatch):
    assert plotting_available()  # the dev extra installs it
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(PlottingUnavailable, match=r"pip install 'tinyattn\[plot\]'") as error:
        require_matplotlib()
    assert "\n" not in str(error.value)
    assert not plotting_available()


def test_plotting_imports_no_other_part_of_tinyattn_but_errors():
    code = ("import sys, tinyattn.analysis.plotting; "
            "print(sorted(m for m in sys.modules if m.startswith('tinyattn')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["['tinyattn',", "'tinyattn.analysis',", "'tinyattn.analysis.plotting',",
                                     "'tinyattn.errors']"]
