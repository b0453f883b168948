"""The chart of tokens/s: one group of bars per search, one bar per engine, as SVG.

Drawn by hand rather than with matplotlib: both take about thirty lines, but matplotlib would
add nine packages (about 100 MB) to the bench extra and write an SVG seven times larger (35 KB
against 5 KB for the same chart) that comes out byte-identical only with extra settings.
"""

from __future__ import annotations

from html import escape

from bench.compare.report import columns, label

COLOURS = ("#1f77b4", "#6baed6", "#9ecae1", "#c6dbef", "#d62728", "#ff9896", "#2ca02c")
BAR, GAP, LEFT, WIDTH = 14, 18, 250, 460  # pixels: bar height, gap between groups, bar area


def svg_chart(rows: list[dict], title: str) -> str:
    """Bars scale to the fastest engine of their own group, so slow searches stay readable."""
    keys = columns(rows)
    height = 50 + (BAR * len(rows) + GAP) * len(keys) + 20
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LEFT + WIDTH + 120}" '
        f'height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    y = 40
    for key in keys:
        top = max(r["cells"][key]["tps"] for r in rows) or 1.0
        parts.append(f'<text x="10" y="{y + 10}" font-weight="bold">{label(key)}</text>')
        y += 14
        for index, row in enumerate(rows):
            value = row["cells"][key]["tps"]
            length = max(1.0, WIDTH * value / top)
            parts += [
                f'<text x="{LEFT - 10}" y="{y + BAR - 3}" text-anchor="end">'
                f"{escape(row['name'])}</text>",
                f'<rect x="{LEFT}" y="{y}" width="{length:.1f}" height="{BAR - 2}" '
                f'fill="{COLOURS[index % len(COLOURS)]}"/>',
                f'<text x="{LEFT + length + 4:.1f}" y="{y + BAR - 3}">{value:.0f} tok/s</text>',
            ]
            y += BAR
        y += GAP - 14
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
