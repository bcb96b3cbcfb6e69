"""Per-case GPU time (lines) and plain-call time (faint, dotted) by implementation against the
speed of light, one panel per workload and precision (one PNG; block rows only)."""

from __future__ import annotations

from . import stats

STYLE = {"eager": "tab:gray", "stock_static": "tab:blue", "stock_dynamic": "tab:cyan",
         "backend": "tab:red", "install": "tab:orange"}


def plot(result: dict, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple, list[dict]] = {}
    for r in result["rows"]:
        if stats.kind(r) == "block":
            groups.setdefault((r["workload"], r["precision"]), []).append(r)
    n = max(1, len(groups))
    fig, axes = plt.subplots(n, 1, figsize=(12, 3.8 * n), squeeze=False)
    for ax, ((w, p), rows) in zip(axes[:, 0], sorted(groups.items())):
        cases = []
        for r in rows:
            c = (r["seq"], r["batch"])
            if c not in cases:
                cases.append(c)
        xs = {c: i for i, c in enumerate(cases)}
        sol = {(r["seq"], r["batch"]): r["sol_us"] for r in rows if r.get("sol_us")}
        ax.plot([xs[c] for c in cases if c in sol], [sol[c] for c in cases if c in sol], "k--",
                marker="_", label="SOL")
        lines: dict[tuple, list] = {}
        plain: dict[tuple, list] = {}
        for r in rows:
            x = xs[(r["seq"], r["batch"])]
            if r.get("status") == "ok" and r.get("gpu_us"):
                lines.setdefault((r["impl"], r["form"]), []).append((x, r["gpu_us"]))
            if r.get("plain_us"):
                plain.setdefault((r["impl"], r["form"]), []).append((x, r["plain_us"]))
        for (impl, form), pts in sorted(lines.items()):
            pts.sort()
            ax.plot([x for x, _ in pts], [y for _, y in pts], color=STYLE.get(impl),
                    linestyle="-" if form == "fn" else ":", marker="o" if form == "fn" else "x",
                    label=f"{stats.IMPL_LABELS.get(impl, impl)} ({form})")
        for (impl, form), pts in sorted(plain.items()):
            pts.sort()
            ax.plot([x for x, _ in pts], [y for _, y in pts], color=STYLE.get(impl),
                    linestyle=":", alpha=0.45, linewidth=1,
                    label=f"plain call {stats.IMPL_LABELS.get(impl, impl)} ({form})")
        ax.set_yscale("log")
        ax.set_xticks(range(len(cases)))
        ax.set_xticklabels([f"{s}x{b}" for s, b in cases], rotation=45, fontsize=8)
        ax.set_ylabel("us (GPU: graph replay; faint: plain call)")
        ax.set_title(f"{w} ({p})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, ncol=3)
    fig.suptitle(f"{result.get('env', {}).get('gpu', '?')}: per-case time (S x B) vs SOL")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
