"""Plotting: matplotlib figures for PNG files, and images drawn from arrays with numpy alone.

Two ways to make a picture, for two uses:

- PNG files a person asks for (`scripts/attention.py`, `scripts/eval.py`) are matplotlib
  figures, with labelled axes and a colour bar. matplotlib is an optional extra
  (`pip install 'tinyattn[plot]'`), imported only when a figure is drawn, and only its Agg
  canvas is used: no display, no pyplot state. `require_matplotlib` turns its absence
  into a one-line PlottingUnavailable.
- Images the training loop logs to TensorBoard at every evaluation are drawn straight
  from the numbers: `colormap` maps values through a 17-colour viridis table with
  `np.interp`, `scale_up` and `tile` lay cells out in a grid, and `line_chart` rasterises
  a curve. No text and no layout engine, so a picture costs milliseconds, not the second
  matplotlib spends placing tick labels, and needs nothing beyond numpy.

Images are (H, W, 3) uint8 arrays, rows from the top, as TensorBoard's `add_image(...,
dataformats="HWC")` takes them. This module imports no other part of tinyattn but errors.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from tinyattn.errors import TinyattnError

# matplotlib's viridis sampled at 17 evenly spaced points, as 0-255 RGB; linear
# interpolation between them stays within 6/255 of the full 256-colour table.
VIRIDIS = ((68, 1, 84), (72, 24, 106), (71, 45, 123), (66, 64, 134), (59, 82, 139),
           (51, 99, 141), (44, 114, 142), (38, 130, 142), (33, 145, 140), (31, 160, 136),
           (40, 174, 128), (63, 188, 115), (94, 201, 98), (132, 212, 75), (173, 220, 48),
           (216, 226, 25), (253, 231, 37))
MASKED_RGB = (200, 200, 200)  # NaN cells: grey, which viridis never reaches
WHITE = (255, 255, 255)
LINE_RGB = VIRIDIS[4]  # line_chart's curve
GRID_RGB = (225, 225, 225)  # line_chart's grid lines
CHART_MARGIN = 6  # white pixels around line_chart's plot area


class PlottingUnavailable(TinyattnError):
    """matplotlib, an optional extra, is not installed."""


# ----------------------------------------------------------------------------- matplotlib


def require_matplotlib():
    """The matplotlib module, or a one-line PlottingUnavailable saying how to install it."""
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError:
        raise PlottingUnavailable("plots need matplotlib, an optional extra: "
                                  "pip install 'tinyattn[plot]'") from None
    return matplotlib


def plotting_available() -> bool:
    """Whether matplotlib figures (the PNG files) can be drawn; the numpy images always can."""
    try:
        require_matplotlib()
    except PlottingUnavailable:
        return False
    return True


def new_figure(width_inches: float, height_inches: float, dpi: int, layout: Optional[str] = None):
    """A matplotlib Figure on an Agg canvas, outside pyplot (nothing global to close)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_inches, height_inches), dpi=dpi, layout=layout)
    FigureCanvasAgg(figure)
    return figure


# ----------------------------------------------------------------------------- numpy images


def colormap(values: np.ndarray, low: float = 0.0, high: float = 1.0,
             colors: Sequence[tuple[int, int, int]] = VIRIDIS,
             masked: tuple[int, int, int] = MASKED_RGB) -> np.ndarray:
    """values (...) -> (..., 3) uint8: `low` and below is colors[0], `high` and above colors[-1].

    NaN values are drawn `masked`, so a masked cell is not mistaken for a small value.
    """
    values = np.asarray(values, dtype=np.float64)
    table = np.asarray(colors, dtype=np.float64)  # (N, 3)
    stops = np.linspace(low, high, len(table))  # (N,)
    nan = np.isnan(values)
    filled = np.where(nan, low, values)
    image = np.stack([np.interp(filled, stops, table[:, c]) for c in range(3)], axis=-1)  # (..., 3)
    image = np.rint(image).astype(np.uint8)
    image[nan] = masked
    return image


def scale_up(image: np.ndarray, factor: int) -> np.ndarray:
    """(H, W, 3) -> (H*factor, W*factor, 3): every pixel becomes a factor x factor block."""
    return np.repeat(np.repeat(image, factor, axis=0), factor, axis=1)


def tile(cells: Sequence[np.ndarray], columns: int, gap: int = 2,
         gap_color: tuple[int, int, int] = WHITE) -> np.ndarray:
    """Equal-sized (h, w, 3) cells in a grid filled row by row, `gap` pixels of gap_color apart.

    The result is (rows*h + (rows-1)*gap, columns*w + (columns-1)*gap, 3) with
    rows = ceil(len(cells) / columns); places past the last cell are gap_color.
    """
    h, w, _ = cells[0].shape
    rows = -(-len(cells) // columns)
    grid = np.empty((rows * h + (rows - 1) * gap, columns * w + (columns - 1) * gap, 3), dtype=np.uint8)
    grid[:] = gap_color
    for n, cell in enumerate(cells):
        row, column = divmod(n, columns)
        top, left = row * (h + gap), column * (w + gap)
        grid[top:top + h, left:left + w] = cell
    return grid


def line_chart(x: np.ndarray, y: np.ndarray, width: int, height: int, y_range: tuple[float, float], *,
               x_grid: Sequence[float] = (), y_grid: Sequence[float] = (), margin: int = CHART_MARGIN,
               line_color: tuple[int, int, int] = LINE_RGB,
               grid_color: tuple[int, int, int] = GRID_RGB) -> np.ndarray:
    """y against x as a 2-pixel line on white, (height, width, 3) uint8; no text.

    x must increase; it spans the plot's width, y_range its height (larger y is higher).
    Grid lines at the x_grid and y_grid values inside the plot stand in for tick labels.
    NaN values of y are skipped: the line joins the points either side.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    image = np.full((height, width, 3), 255, dtype=np.uint8)
    plot_w, plot_h = width - 2 * margin, height - 2 * margin
    x_span = max(x[-1] - x[0], 1e-12)
    y_low, y_high = y_range
    y_span = max(y_high - y_low, 1e-12)

    def column(value):  # data x -> pixel column
        return np.rint(margin + (np.asarray(value) - x[0]) / x_span * (plot_w - 1)).astype(int)

    def row(value):  # data y -> pixel row, clipped to the plot
        r = margin + (y_high - np.asarray(value)) / y_span * (plot_h - 1)
        return np.rint(np.clip(r, margin, margin + plot_h - 1)).astype(int)

    for value in y_grid:
        if y_low <= value <= y_high:
            image[row(value), margin:margin + plot_w] = grid_color
    for value in x_grid:
        if x[0] <= value <= x[-1]:
            image[margin:margin + plot_h, column(value)] = grid_color

    # Sample the curve at every pixel column, then fill each column from its row to the
    # next column's, so steep stretches stay joined.
    pixels = np.arange(plot_w)
    data_x = x[0] + pixels / max(plot_w - 1, 1) * x_span
    keep = ~np.isnan(y)
    if not keep.any():
        return image
    ys = np.interp(data_x, x[keep], y[keep])
    inside = (data_x >= x[keep][0]) & (data_x <= x[keep][-1])
    rows = row(ys)  # (plot_w,)
    following = np.append(rows[1:], rows[-1])
    # + 1: two pixels thick on flat stretches; on the plot's bottom row the second pixel goes above
    bottom = np.minimum(np.maximum(rows, following) + 1, margin + plot_h - 1)
    top = np.minimum(np.minimum(rows, following), bottom - 1)
    every_row = np.arange(height)[:, None]  # (height, 1)
    drawn = (every_row >= top) & (every_row <= bottom) & inside  # (height, plot_w)
    image[:, margin:margin + plot_w][drawn] = line_color
    return image
