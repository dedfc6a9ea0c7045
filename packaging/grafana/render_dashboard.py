#!/usr/bin/env python3
"""Renders gpu-mode-dashboard.json to a PNG without Grafana (not a Debian
package): each panel's own PromQL queries are evaluated by a real Prometheus
(query_range over its HTTP API) and drawn with matplotlib where the
dashboard's gridPos puts the panel. Grafana's variables are replaced as
Grafana would: $__rate_interval by --rate-interval, $__range by the whole
time range, $instance by every instance (.*).

  render_dashboard.py --prometheus http://127.0.0.1:PORT --start UNIX --end UNIX \
      --dashboard packaging/grafana/gpu-mode-dashboard.json --out docs/img/dashboard.png

How the picture in docs/metrics.md was made: packaging/grafana/render-picture.sh.
"""

import argparse
import json
import math
import sys
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GRID_W, ROW_H = 24, 1.0


def query_range(base, expr, start, end, step):
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{q}", timeout=30) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise SystemExit(f"Prometheus refused {expr!r}: {body}")
    return body["data"]["result"]


def legend(fmt, labels):
    out = fmt or "{{__name__}}"
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out


def substitute(expr, rate_interval, range_secs):
    return expr.replace("$__rate_interval", rate_interval).replace("$__range", f"{range_secs}s").replace("$instance", ".*")


def human(v, unit):
    if unit == "bytes" or unit == "Bps":
        for suffix in ["B", "KiB", "MiB", "GiB", "TiB"]:
            if abs(v) < 1024:
                return f"{v:.3g} {suffix}" + ("/s" if unit == "Bps" else "")
            v /= 1024
    if unit == "s":
        return f"{v:.3g} s"
    return f"{v:.3g}"


def draw_panel(ax, panel, series, start, end, unit):
    ax.set_title(panel["title"], fontsize=9, loc="left")
    ax.tick_params(labelsize=7)
    if panel["type"] == "stat":
        last = [s[-1][1] for _, s in series if s]
        value = max(last) if last else float("nan")
        ax.axis("off")
        color = "#37872d" if not math.isnan(value) and value < 1 else "#c4162a"
        text = "no data" if math.isnan(value) else human(value, unit)
        ax.text(0.5, 0.45, text, fontsize=26, ha="center", va="center", color=color, transform=ax.transAxes)
        return
    if not series:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", fontsize=9, color="grey", transform=ax.transAxes)
    for name, points in series:
        xs = [(t - start) / 60 for t, _ in points]
        ax.plot(xs, [v for _, v in points], linewidth=1, label=name)
    ax.set_xlabel("minutes into the churn", fontsize=7)
    if unit in ("bytes", "Bps", "s"):
        ax.set_ylabel(unit, fontsize=7)
    ax.set_xlim(0, (end - start) / 60)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=6, loc="upper left", ncol=2, frameon=False)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dashboard", required=True)
    p.add_argument("--prometheus", required=True)
    p.add_argument("--start", type=float, required=True)
    p.add_argument("--end", type=float, required=True)
    p.add_argument("--step", default="2s")
    p.add_argument("--rate-interval", default="30s")
    p.add_argument("--out", required=True)
    p.add_argument("--subtitle", default="")
    a = p.parse_args()
    dash = json.load(open(a.dashboard))
    rows = max(pn["gridPos"]["y"] + pn["gridPos"]["h"] for pn in dash["panels"])
    fig = plt.figure(figsize=(16, rows * 0.36))
    fig.suptitle(f"{dash['title']} — {a.subtitle}", fontsize=11, x=0.01, ha="left")
    top_margin = 0.05
    for panel in dash["panels"]:
        g = panel["gridPos"]
        series = []
        for t in panel["targets"]:
            expr = substitute(t["expr"], a.rate_interval, int(a.end - a.start))
            for r in query_range(a.prometheus, expr, a.start, a.end, a.step):
                pts = [(float(ts), float(v)) for ts, v in r["values"] if not math.isnan(float(v))]
                series.append((legend(t.get("legendFormat"), r["metric"]), pts))
        left, width = g["x"] / GRID_W + 0.035, g["w"] / GRID_W - 0.05
        height = (g["h"] / rows) * (1 - top_margin) - 0.075
        bottom = 1 - top_margin - (g["y"] + g["h"]) / rows * (1 - top_margin) + 0.035
        ax = fig.add_axes([left, bottom, width, height])
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        draw_panel(ax, panel, series, a.start, a.end, unit)
        print(f"{panel['title']}: {len(series)} series", file=sys.stderr)
    fig.savefig(a.out, dpi=80)


if __name__ == "__main__":
    main()
