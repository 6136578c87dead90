"""The chapters' figures (course tooling, written by hand), one section a chapter.

A chapter computes what it shows (the numbers are the lesson) and hands them here to be drawn:
the layout, colour scales and labels of a figure are not the lesson, and would otherwise fill
the chapter's cells. Each function draws one figure with matplotlib and shows it.
"""

from __future__ import annotations

import json
from pathlib import Path


def _plt():
    import matplotlib.pyplot as plt  # here: importing the course tooling needs no matplotlib

    return plt


# --------------------------------------------------------------------------- chapter 0


# --------------------------------------------------------------------------- chapter 1


# --------------------------------------------------------------------------- chapter 2


# --------------------------------------------------------------------------- chapter 3


# --------------------------------------------------------------------------- chapter 4


# --------------------------------------------------------------------------- chapter 5


# --------------------------------------------------------------------------- chapter 6


# --------------------------------------------------------------------------- chapter 7


def training_curve(history, baselines):
    """Chapter 7: every batch's loss and the validation estimates, against the counting lines."""
    plt = _plt()
    _, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot(
        history.step, history.train_loss, color="tab:blue", alpha=0.3, label="train (each batch)"
    )
    ax.plot(history.eval_step, history.eval_val_loss, "o-", color="tab:orange", label="validation")
    for name, style in (("unigram", ":"), ("bigram", "--")):
        value = baselines[name]
        ax.axhline(value, color="grey", ls=style, label=f"{name} line {value:.2f}")
    ax.set(xlabel="step", ylabel="loss (nats per token)", title="your pieces training GPT-2")
    ax.legend(fontsize=8)
    plt.show()


# --------------------------------------------------------------------------- chapter 8


def attention_grid(attn, model_name, row=0):
    """Every head's attention on one sequence: attn is run_with_cache's list of (B, nh, T, T)."""
    plt = _plt()
    n_layer, n_head = len(attn), attn[0].shape[1]
    fig, axes = plt.subplots(
        n_layer, n_head, figsize=(1.2 * n_head + 1, 1.2 * n_layer + 0.6), squeeze=False
    )
    for layer in range(n_layer):
        for head in range(n_head):
            ax = axes[layer, head]
            im = ax.imshow(attn[layer][row, head].float().cpu(), cmap="Blues", vmin=0, vmax=1)
            ax.set(
                xticks=[],
                yticks=[],
                ylabel=f"layer {layer}" if head == 0 else "",
                xlabel=f"head {head}" if layer == n_layer - 1 else "",
            )
    fig.suptitle(f"attention of every head ({model_name}); rows: queries, columns: keys")
    fig.colorbar(im, ax=axes, shrink=0.6, label="attention probability")
    plt.show()


def lens_map(right, words, model_name):
    """The logit lens's log-probability of the right next token: right (n_layer + 1, T - 1)."""
    plt = _plt()
    n_rows = right.shape[0]
    fig, ax = plt.subplots(figsize=(12, 0.35 * (n_rows - 1) + 2.5))
    im = ax.imshow(right.float().cpu(), cmap="magma", aspect="auto", vmin=-15, vmax=0)
    ax.set(
        xticks=range(len(words) - 1),
        xticklabels=[f"{a!r}→{b!r}" for a, b in zip(words, words[1:])],
        yticks=range(n_rows),
        yticklabels=["embed"] + [f"after {i}" for i in range(n_rows - 1)],
        ylabel="stream read after block",
        title=f"logit lens: log-p of the right next token ({model_name})",
    )
    ax.tick_params(axis="x", rotation=70)
    fig.colorbar(im, ax=ax, label="log-probability")
    plt.show()


def head_patterns(attn, shown, seq_len, model_name, row=0):
    """Attention maps of a few heads on repeated tokens; shown: [(what, (layer, head)), ...]."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(shown), figsize=(5.5 * len(shown), 4.8), squeeze=False)
    for ax, (what, (layer, head)) in zip(axes[0], shown):
        im = ax.imshow(attn[layer][row, head].float().cpu(), cmap="Blues", vmin=0, vmax=1)
        ax.axhline(seq_len + 0.5, color="red", lw=0.8)  # below: the queries of the second copy
        ax.set(
            xlabel="key position",
            ylabel="query position",
            title=f"{what}: head {layer}.{head}\n({model_name})",
        )
    fig.colorbar(im, ax=axes, label="attention probability")
    plt.show()


def layer_head_maps(panels, model_name, label, vmin=0.0, vmax=1.0, cmap="viridis"):
    """Side by side, one (n_layer, n_head) map a panel, on one colour scale; panels: [(map, title)]."""
    plt = _plt()
    n_layer, n_head = panels[0][0].shape
    fig, axes = plt.subplots(
        1, len(panels), figsize=(max(12, 1.0 * n_head + 6), 0.45 * n_layer + 2.5), squeeze=False
    )
    for ax, (values, title) in zip(axes[0], panels):
        im = ax.imshow(values.float().cpu(), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        ax.set(
            xlabel="head",
            ylabel="layer",
            title=f"{title}\n({model_name})",
            yticks=range(n_layer),
            xticks=range(0, n_head, max(1, n_head // 12)),
        )  # whole heads only
    fig.colorbar(im, ax=axes, label=label)
    plt.show()


def training_log(log_file, model_name):
    """The best induction and previous-token scores a circuits model's training log recorded
    (tools/make_circuits.py writes it: {"columns": [...], "rows": [...]}); says so when there is
    no log. Prints the first logged step with an induction score above 0.4."""
    log_file = Path(log_file)
    if not log_file.is_file():
        print(
            f"no training log for {model_name} ({log_file.name} is not in {log_file.parent}): "
            "nothing to plot"
        )
        return
    plt = _plt()
    log = json.loads(log_file.read_text(encoding="utf-8"))
    column = {name: [row[i] for row in log["rows"]] for i, name in enumerate(log["columns"])}
    fig, ax = plt.subplots(figsize=(8, 3.5))
    for key in ("induction", "previous"):
        ax.plot(column["step"], column[key], marker=".", label=f"best {key} score")
    record = log_file.parent / "training_record.json"  # tools/make_circuits.py's two stages
    stage1 = (
        json.loads(record.read_text(encoding="utf-8")).get("stage1_steps")
        if record.is_file()
        else None
    )
    if stage1:
        ax.axvline(stage1, color="grey", linestyle="--", label="stage 2 (repeated segments) starts")
    ax.set(
        xlabel="training step",
        ylabel="score",
        ylim=(0, 1),
        title=f"scores during training ({model_name})",
    )
    ax.legend()
    plt.show()
    print(
        "first logged step with an induction score above 0.4:",
        next((step for step, v in zip(column["step"], column["induction"]) if v > 0.4), "none"),
    )


def loss_by_position(per_position, seq_len, model_name):
    """The mean loss at each predicted position of the repeated sequences: per_position (2L,)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.plot(range(1, len(per_position) + 1), per_position.float().cpu())
    ax.axvline(seq_len + 0.5, color="grey", linestyle="--")
    ax.set(
        xlabel="position of the predicted token (dashed: the second copy starts)",
        ylabel="loss (nats)",
        title=f"loss on random common tokens repeated twice ({model_name})",
    )
    plt.show()


# --------------------------------------------------------------------------- chapter 9


def filtered_distributions(next_logits, settings, tokenizer, shown=12):
    """Bars of the `shown` most likely tokens under each sampling setting {title: kwargs}, as
    gpt2lib.generation.next_token_probs computes them, with how many tokens each keeps."""
    import torch

    from gpt2lib.generation import next_token_probs

    plt = _plt()
    top = torch.topk(torch.softmax(next_logits.float(), -1), shown).indices
    labels = [repr(tokenizer.decode([i]))[1:-1] for i in top.tolist()]
    fig, axes = plt.subplots(
        1, len(settings), figsize=(3.6 * len(settings), 3.5), sharey=True, squeeze=False
    )
    for ax, (title, kwargs) in zip(axes[0], settings.items()):
        p = next_token_probs(next_logits, **kwargs)
        ax.bar(range(len(top)), p[top])
        ax.set_xticks(range(len(top)), labels, rotation=90)
        ax.set_title(f"{title}\n(kept: {int((p > 0).sum())} tokens)")
    axes[0, 0].set_ylabel("probability")
    plt.show()


def cache_slots(starts, counts, max_len, labels):
    """Which call wrote each slot of a static cache: call c writes counts[c] slots from starts[c]."""
    import torch

    plt = _plt()
    written_by = torch.full((len(counts), max_len), float("nan"))  # nan: empty
    for call, (start, n) in enumerate(zip(starts, counts)):
        written_by[call:, start : start + n] = call  # from this call on, these slots hold keys
    fig, ax = plt.subplots(figsize=(6, 2.4))
    image = ax.imshow(written_by, cmap="viridis", vmin=0, vmax=len(counts) - 1)
    ax.set_xticks(range(max_len))
    ax.set_yticks(range(len(counts)), labels)
    ax.set_xlabel("cache slot (= position)")
    fig.colorbar(image, ax=ax, ticks=range(len(counts)), label="call that wrote the slot")
    ax.set_title("the cache after each call (white: empty)")
    plt.show()


# --------------------------------------------------------------------------- chapter 10


# --------------------------------------------------------------------------- chapter 11
