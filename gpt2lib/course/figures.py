"""The chapters' figures (course tooling, written by hand), one section a chapter.

A chapter computes what it shows (the numbers are the lesson) and hands them here to be drawn:
the layout, colour scales and labels of a figure are not the lesson, and would otherwise fill
the chapter's cells. Each function draws one figure with matplotlib and shows it.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path


def _plt():
    import matplotlib.pyplot as plt  # here: importing the course tooling needs no matplotlib

    return plt


@contextlib.contextmanager
def _axes(figsize: tuple[float, float]):
    """One figure with one set of axes, shown when the block ends."""
    plt = _plt()
    _, ax = plt.subplots(figsize=figsize)
    yield ax
    plt.show()


# --------------------------------------------------------------------------- chapter 0


# --------------------------------------------------------------------------- chapter 1


def bytes_per_token(sizes, ratios, gpt2_ratio):
    """Bytes per token on held-out text against the vocabulary size, with GPT-2's as a line."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3))
    ax.plot(sizes, ratios, "o-", label="trained on 20,000 characters of Shakespeare")
    ax.axhline(gpt2_ratio, color="grey", ls="--", label="GPT-2 (50,257 ids, web text)")
    ax.set(xscale="log", xlabel="vocabulary size (ids, log scale)", ylabel="bytes per token")
    ax.legend()
    plt.tight_layout()
    plt.show()


_PALETTE = ["#fde2a7", "#b9e4c9", "#c7d7f5", "#f7c6d9", "#d9c8f0", "#c4ece9"]


def show_tokens(samples, tokenizer):
    """Each text of `samples` (name -> text) with one coloured span per token; hover for its id."""
    import html

    from IPython.display import HTML, display

    for name, text in samples.items():
        ids = tokenizer.encode(text, allowed_special="all")
        spans = []
        for i, token_id in enumerate(ids):
            raw = tokenizer.decode_single_token_bytes(token_id).decode("utf-8", errors="replace")
            shown = html.escape(raw).replace(" ", "·").replace("\n", "↵<br>")
            style = f"background:{_PALETTE[i % 6]};border-radius:3px"
            spans.append(f'<span title="id {token_id}" style="{style}">{shown}</span>')
        box = '<div style="font-family:monospace;line-height:1.9">' + "".join(spans) + "</div>"
        display(HTML(f"<b>{name}</b>: {len(ids)} tokens" + box))


# --------------------------------------------------------------------------- chapter 2


def position_cosines(table, name):
    """A position table (P, C), its first 64 features, beside the cosines of its rows (P, P)."""
    import torch

    plt = _plt()
    table = table.detach().float().cpu()
    unit = table / table.norm(dim=1, keepdim=True).clamp_min(1e-12)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    im1 = ax1.imshow(table[:, :64], cmap="RdBu", aspect="auto")
    ax1.set(title=f"{name}: positions × features", xlabel="feature", ylabel="position")
    fig.colorbar(im1, ax=ax1)
    im2 = ax2.imshow(torch.mm(unit, unit.T), cmap="viridis", vmin=-1, vmax=1)
    ax2.set(title=f"{name}: cosine similarity of positions", xlabel="position", ylabel="position")
    fig.colorbar(im2, ax=ax2)
    plt.tight_layout()
    plt.show()


# --------------------------------------------------------------------------- chapter 3


def attention_weights(weights, title, labels=None):
    """(T, T) attention weights as a picture: row i is what token i reads; labels name tokens."""
    plt = _plt()
    labels = [str(i) for i in range(len(weights))] if labels is None else labels
    fig, ax = plt.subplots(figsize=(1.8 + 0.35 * len(labels), 1.2 + 0.35 * len(labels)))
    im = ax.imshow(weights, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(labels)), labels, rotation=90)
    ax.set_yticks(range(len(labels)), labels)
    ax.set(xlabel="key j (what is read)", ylabel="query i (who reads)", title=title)
    fig.colorbar(im, ax=ax)
    plt.show()


def saturation(dims, largest, tokens=16):
    """The average largest softmax weight against the width d; largest: label -> values."""
    with _axes(figsize=(5, 3)) as ax:
        for name, values in largest.items():
            ax.plot(dims, values, "o-", label=name)
        ax.axhline(1 / tokens, ls=":", c="gray", label=f"uniform over {tokens} tokens")
        ax.set(xscale="log", xlabel="d", ylabel="average largest weight", ylim=(0, 1.05))
        ax.legend()


# --------------------------------------------------------------------------- chapter 4


def width_fit(widths, with_gelu, without):
    """The best fit's error against the hidden width, with GELU and with no activation."""
    with _axes(figsize=(6, 3.5)) as ax:
        ax.loglog(widths, with_gelu, marker="o", label="GELU")
        ax.loglog(widths, without, marker="o", label="no activation")
        ax.set(xlabel="hidden width H", ylabel="mean squared error of the best fit")
        ax.legend()


def relu_gelu(xs, relu, gelu):
    """ReLU and GELU drawn over xs."""
    with _axes(figsize=(6, 3.5)) as ax:
        ax.plot(xs, relu, label="ReLU: max(0, x)", linestyle="--")
        ax.plot(xs, gelu, label="GELU: x·Φ(x)")
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set(xlabel="x", ylabel="activation", title="ReLU and GELU")
        ax.legend()


def gelu_difference(xs, difference):
    """The tanh GELU minus the erf GELU over xs."""
    with _axes(figsize=(6, 3.2)) as ax:
        ax.plot(xs, difference)
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set(title="GELU: tanh form minus erf form", xlabel="x", ylabel="difference")


def hidden_histogram(before, after):
    """Histograms of an MLP's hidden values before and after GELU (1-D tensors)."""
    with _axes(figsize=(7, 3.5)) as ax:
        bins = [-2.5 + 0.05 * i for i in range(101)]
        ax.hist(before.numpy(), bins=bins, alpha=0.6, label="before GELU (c_fc output)")
        ax.hist(after.numpy(), bins=bins, alpha=0.6, label="after GELU")
        ax.set(xlabel="hidden value", ylabel="count", title=f"{before.numel():,} hidden values")
        ax.legend()


def curve_fit(x, y, fit, units):
    """The target curve and the best fit with `units` hidden units."""
    with _axes(figsize=(6, 3.2)) as ax:
        ax.plot(x, y, color="black", label="target")
        ax.plot(x, fit, linestyle="--", label=f"your {units} units")
        ax.set(xlabel="x", ylabel="y", title="the best fit with your first layer")
        ax.legend()


# --------------------------------------------------------------------------- chapter 5


def residual_stream(results):
    """Norms and cosines with the input after each block; results: label -> (norms, cosines)."""
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for label, (norms, cosines) in results.items():
        left.plot(norms, marker="o", label=label)
        right.plot(cosines, marker="o", label=label)
    left.set(title="size of the stream", xlabel="after block", ylabel="mean token norm")
    right.set(title="the input still there", xlabel="after block", ylabel="mean cosine")
    left.legend()
    right.legend()
    plt.show()


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
    with _axes(figsize=(9, 3)) as ax:
        ax.plot(range(1, len(per_position) + 1), per_position.float().cpu())
        ax.axvline(seq_len + 0.5, color="grey", linestyle="--")
        ax.set(
            xlabel="position of the predicted token (dashed: the second copy starts)",
            ylabel="loss (nats)",
            title=f"loss on random common tokens repeated twice ({model_name})",
        )


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


def rank_sweep(results, title):
    """The response loss's drop against the share of parameters trained, one point per LoRA
    rank; `results` holds (rank, share trained, drop) tuples."""
    with _axes(figsize=(5, 3)) as ax:
        ax.plot([100 * s for _, s, _ in results], [d for _, _, d in results], "o-")
        for rank, share, drop in results:
            ax.annotate(f"rank {rank}", (100 * share, drop))
        ax.set(xlabel="parameters trained (%)", ylabel="response loss drop (nats)", title=title)


# --------------------------------------------------------------------------- chapter 11
