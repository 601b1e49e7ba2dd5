"""The figure of ``nanocore bench interference``: A's token timeline and inter-token latency per mode."""
from __future__ import annotations


def plot_timelines(rows: list[dict], workload: dict, path: str, title: str = "") -> None:
    """Left: A's tokens over time (B's arrival and first token marked). Right: A's inter-token latency."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib; pip install 'nanocore-llm[plot]' (or matplotlib)") from None
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for i, row in enumerate(rows):
        color = f"C{i}"
        t = row["timeline"]
        tokens = range(1, len(t["a_token_ms"]) + 1)
        label = f"{row['mode']} (max ITL {row['a_max_itl_ms']:.1f} ms, B TTFT {row['b_ttft_ms']:.0f} ms)"
        left.plot(t["a_token_ms"], tokens, ".-", color=color, markersize=3, linewidth=1, label=label)
        left.axvline(t["b_arrival_ms"], color=color, linestyle=":", linewidth=1)
        left.plot([t["b_first_token_ms"]], [workload["b_arrive_after"]], "x", color=color, markersize=10, mew=2)
        right.plot(range(2, len(t["a_token_ms"]) + 1), [b - a for a, b in zip(t["a_token_ms"], t["a_token_ms"][1:])],
                   ".-", color=color, markersize=3, linewidth=1, label=row["mode"])
    left.set_xlabel("time since A was added (ms)")
    left.set_ylabel("A's output tokens")
    left.set_title(f"A's tokens; B ({workload['b_prompt_len']} tokens) arrives at the dotted line, x = B's first token",
                   fontsize=9)
    left.legend(fontsize=8, loc="upper left")
    right.set_yscale("log")
    right.set_xlabel("A's token index")
    right.set_ylabel("inter-token latency (ms, log)")
    right.axvline(workload["b_arrive_after"] + 1, color="grey", linestyle=":", linewidth=1)
    right.set_title("A's inter-token latency (dotted: first token after B arrives)", fontsize=9)
    right.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """``python -m nanocore.bench.interference_plot RESULT.json OUT.png``: the figure from a saved result."""
    import argparse
    import json

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("json_path")
    p.add_argument("png_path")
    args = p.parse_args(argv)
    data = json.loads(open(args.json_path).read())
    title = f"{data['config']['model']} on {data['environment'].get('gpu') or data['environment']['device']}"
    plot_timelines(data["results"], data["workload"], args.png_path, title=title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
