"""Checks for chapter 2's exercises: embedding lookups, positions, and the size of the tables.

Each check runs the learner's answer on small random cases, compares it with the right answer
and with known wrong answers, and names the mistake when one of those matches.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2lib.checks._core import CheckFailed, call_learner, passed

EX_ONE_HOT = "Exercise 2.1 (one_hot_embed)"
EX_EMBED = "Exercise 2.2 (embed)"
EX_COUNT = "Exercise 2.3 (embedding_parameter_count)"


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and torch.allclose(got.double(), want.double(), atol=1e-5)


def _require_tensor(exercise: str, got, what: str) -> torch.Tensor:
    if not isinstance(got, torch.Tensor):
        raise CheckFailed(exercise, f"{what} should be a torch.Tensor, got {type(got).__name__}")
    if not got.is_floating_point():
        raise CheckFailed(
            exercise,
            f"{what} has dtype {got.dtype}; embeddings are floating point like the table "
            "(if you built one-hot vectors, convert them with .to(table.dtype) before the matmul)",
        )
    return got


# --------------------------------------------------------------------------- Exercise 2.1


def _explain_one_hot_error(exc: RuntimeError, V: int, C: int):
    """Turn the usual errors of a one-hot matmul into a message that names the mistake."""
    text = str(exc)
    if "dtype" in text or "Long" in text or "long" in text:
        raise CheckFailed(
            EX_ONE_HOT,
            f"the matmul fails ({text}): F.one_hot returns integers (torch.long) and the table "
            "holds floats. Convert the one-hot vectors first: .to(table.dtype) (or .float()).",
        ) from None
    if "num_classes" in text:
        raise CheckFailed(
            EX_ONE_HOT,
            f"F.one_hot fails ({text}): num_classes is the vocabulary size, the number of ROWS of "
            f"the table (table.shape[0] = {V} here), not its width C = {C}.",
        ) from None
    if "size" in text or "shape" in text:
        raise CheckFailed(
            EX_ONE_HOT,
            f"the matmul fails ({text}). The one-hot vectors (..., V) go on the left: "
            "one_hot @ table, (..., V) @ (V, C) -> (..., C); table @ one_hot does not fit.",
        ) from None
    raise exc


def check_one_hot_embed(one_hot_embed) -> None:
    """`one_hot_embed(token_ids, table)`: ids of any shape (...), table (V, C) -> (..., C)."""
    gen = torch.Generator().manual_seed(0)
    V, C = 7, 5
    table = torch.randn(V, C, generator=gen)
    ids = torch.tensor([[0, 3, 6, 3, 1, 2], [5, 4, 4, 0, 6, 2]])  # (B=2, T=6), uses ids 0 and V-1

    try:
        got = call_learner(EX_ONE_HOT, one_hot_embed, ids, table.clone())
    except RuntimeError as exc:
        _explain_one_hot_error(exc, V, C)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (2, 6, V):
        raise CheckFailed(
            EX_ONE_HOT,
            f"your output has shape {tuple(got.shape)}, one entry per vocabulary id: that is the "
            "one-hot matrix itself. Multiply it by the table: (B, T, V) @ (V, C) -> (B, T, C).",
        )
    got = _require_tensor(EX_ONE_HOT, got, "your output")
    want = table[ids]  # (B, T, C)
    if got.shape != want.shape:
        raise CheckFailed(
            EX_ONE_HOT,
            f"expected shape {tuple(want.shape)} (ids' shape plus C={C}), got {tuple(got.shape)}",
        )
    if not _close(got, want):
        wrong = {
            "your rows are shifted by one: the row for id i is row i of the table (ids count "
            "from 0, so id 0 is row 0)": table[(ids - 1) % V],
            "your rows are shifted by one the other way: the row for id i is row i of the "
            "table, not row i + 1": table[(ids + 1) % V],
        }
        for message, value in wrong.items():
            if _close(got, value):
                raise CheckFailed(EX_ONE_HOT, message)
        raise CheckFailed(
            EX_ONE_HOT,
            "the shape is right but the values are not the table rows of the ids: row b, t of "
            "the output must equal table[token_ids[b, t]]",
        )

    # ids that do not reach the last row: catches F.one_hot without num_classes
    small_ids = torch.tensor([0, 2, 1, 2])  # (T=4,), largest id 2 < V - 1
    try:
        got_small = call_learner(EX_ONE_HOT, one_hot_embed, small_ids, table.clone())
    except RuntimeError as exc:
        raise CheckFailed(
            EX_ONE_HOT,
            f"works when the ids include {V - 1} (the last id) but fails on ids whose largest "
            f"value is 2 ({exc}). F.one_hot(ids) alone makes vectors only max(ids) + 1 long; "
            "pass num_classes=table.shape[0].",
        ) from None
    got_small = _require_tensor(EX_ONE_HOT, got_small, "your output for 1-D ids")
    if not _close(got_small, table[small_ids]):
        raise CheckFailed(
            EX_ONE_HOT,
            f"for 1-D ids of shape (4,) expected shape (4, {C}) with rows table[ids], got shape "
            f"{tuple(got_small.shape)}; make it work for ids of any shape",
        )

    # the table must stay in the autograd graph: training updates exactly the rows used
    leaf = table.clone().requires_grad_(True)
    out = call_learner(EX_ONE_HOT, one_hot_embed, ids, leaf)
    if not isinstance(out, torch.Tensor) or not out.requires_grad:
        raise CheckFailed(
            EX_ONE_HOT,
            "no gradient reaches the table through your output; keep the computation in torch "
            "(no .detach(), .numpy(), .tolist() or torch.no_grad())",
        )
    out.sum().backward()
    counts = torch.bincount(ids.flatten(), minlength=V).to(table.dtype)  # uses per id
    if leaf.grad is None or not torch.allclose(leaf.grad, counts[:, None].expand(V, C)):
        raise CheckFailed(EX_ONE_HOT, "the gradient reaching the table is not the number of uses of each row")
    passed(EX_ONE_HOT, "one-hot @ table picks the same rows as table[ids], gradients included")


# --------------------------------------------------------------------------- Exercise 2.2


def _embed_variants(idx, wte, wpe, past):
    B, T = idx.shape
    pos = torch.arange(past, past + T)
    return {
        "positions start at 1, but GPT-2 counts positions from 0: the first token uses row 0 of "
        "the position table": wte(idx) + wpe(pos + 1),
        "you looked up the token ids in the position table; the position table is indexed by "
        "where a token sits (0, 1, 2, ...), not by which token it is": wte(idx) + wpe(idx),
        "you ignored past_length: with past_length tokens already processed, the new tokens sit "
        "at positions past_length, past_length + 1, ...": wte(idx) + wpe(torch.arange(T)),
        "there are no position embeddings in your output: add wpe at the tokens' positions": wte(idx),
        "you used the batch index as the position; the position is the index along T (dim 1), "
        "the same for every sequence in the batch": wte(idx) + wpe(torch.arange(B))[:, None, :],
        "your output holds only the position embeddings; add the token embeddings too": wpe(pos).expand(B, T, -1),
    }


def check_embed(embed) -> None:
    """`embed(idx, wte, wpe, past_length=0)`: idx (B, T) -> token + position embeddings (B, T, C)."""
    torch.manual_seed(0)
    V, P, C = 11, 16, 6  # vocab, positions, width; P > V so a wrong wpe(idx) still runs
    wte, wpe = nn.Embedding(V, C), nn.Embedding(P, C)
    idx = torch.tensor([[3, 0, 10, 7, 7], [1, 9, 2, 4, 8]])  # (B=2, T=5): T != B on purpose
    with torch.no_grad():
        # the keyword first (so a missing past_length parameter is named), then the default
        for kwargs in ({"past_length": 0}, {}, {"past_length": 4}):
            past = kwargs.get("past_length", 0)
            try:
                got = call_learner(EX_EMBED, embed, idx, wte, wpe, **kwargs)
            except RuntimeError as exc:
                if "must match the size" not in str(exc):
                    raise
                raise CheckFailed(
                    EX_EMBED,
                    f"for idx of shape (B, T) = {tuple(idx.shape)} your function fails ({exc}). "
                    "You need one position per token of a sequence: T = idx.shape[1] positions "
                    "(idx.shape[0] is the batch size B).",
                ) from None
            label = "your output" + (f" with past_length={past}" if past else "")
            got = _require_tensor(EX_EMBED, got, label)
            want = wte(idx) + wpe(torch.arange(past, past + idx.shape[1]))  # (B, T, C)
            if got.shape != want.shape:
                raise CheckFailed(
                    EX_EMBED,
                    f"{label} has shape {tuple(got.shape)}; expected (B, T, C) = {tuple(want.shape)}. "
                    "Token and position embeddings are added, not concatenated.",
                )
            if _close(got, want):
                continue
            for message, value in _embed_variants(idx, wte, wpe, past).items():
                if _close(got, value):
                    raise CheckFailed(EX_EMBED, message)
            raise CheckFailed(
                EX_EMBED,
                f"{label} has the right shape but wrong values: out[b, t] must be "
                "wte(idx[b, t]) + wpe(past_length + t)",
            )
    passed(EX_EMBED, "token embeddings plus position embeddings, offset by past_length")


# --------------------------------------------------------------------------- Exercise 2.3


def check_embedding_parameter_count(embedding_parameter_count) -> None:
    """`embedding_parameter_count(config)` -> number of weights in wte and wpe together."""
    from gpt2lib.config import GPT2Config

    configs = [
        GPT2Config(vocab_size=100, n_positions=32, n_embd=8, n_layer=3, n_head=2),
        GPT2Config.from_name("gpt2"),
        GPT2Config.from_name("gpt2-medium"),
    ]
    for config in configs:
        got = call_learner(EX_COUNT, embedding_parameter_count, config)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise CheckFailed(EX_COUNT, f"return a number (an int), got {type(got).__name__}")
        V, P, C, L = config.vocab_size, config.n_positions, config.n_embd, config.n_layer
        want = V * C + P * C
        if got == want:
            continue
        wrong = {
            V * C: "you counted only the token table (wte); add the position table (wpe), "
            "n_positions x n_embd",
            P * C: "you counted only the position table (wpe); add the token table (wte), "
            "vocab_size x n_embd",
            2 * V * C + P * C: "you counted the output layer as a separate vocab_size x n_embd "
            "matrix; GPT-2 reuses (ties) wte for its output, so count the table once",
            (V * C + P * C) * L: "you multiplied by n_layer; the embedding tables exist once, "
            "before the first block",
            V * P: "vocab_size x n_positions is not a table in GPT-2; each table has n_embd columns",
            V + P: "you counted rows only; each row holds n_embd numbers",
            (V + P) * (C + 1): "you gave every row a bias as well; an embedding table is only its "
            "weight, n_rows x n_embd, with no bias",
        }
        small = GPT2Config()
        if config.vocab_size != small.vocab_size and got == (small.vocab_size + small.n_positions) * small.n_embd:
            raise CheckFailed(EX_COUNT, f"for (vocab_size={config.vocab_size}, n_positions="
                              f"{config.n_positions}, n_embd={config.n_embd}) you returned GPT-2 small's count; compute it "
                              "from the fields of the config you are given (config.vocab_size, ...)")
        sizes = f"(vocab_size={V}, n_positions={P}, n_embd={C})"
        if got in wrong:
            raise CheckFailed(EX_COUNT, f"for {sizes}: {wrong[got]}")
        raise CheckFailed(EX_COUNT, f"for {sizes} you returned {got}; that is not the size of wte plus wpe")
    passed(EX_COUNT, "wte + wpe = (vocab_size + n_positions) x n_embd")
