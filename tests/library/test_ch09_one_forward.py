"""Generation runs through the model's own modules,
so hooks, ablations, replaced modules and a learner's classes apply with and without the
cache; the GPT2 methods are thin calls of the functions; two threads share one eval model."""

import threading

import pytest
import torch
import torch.nn as nn

from gpt2lib.chapters.block import Block
from gpt2lib.chapters.model import GPT2 as ChapterGPT2
from gpt2lib.generation import generate
from gpt2lib.inspection import ablated_heads

# The shared tiny model (tests/conftest.py) with 3 blocks, so that a test can change the middle
# one (model.h[1]) or the last (model.h[2]); prompt() draws from its 97 token ids.
SIZES = dict(n_layer=3, vocab_size=97)
NEW = 12


def prompt(B=2, T=5, seed=1):
    return torch.randint(
        0, SIZES["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed)
    )


@torch.no_grad()
def greedy_by_full_forwards(model, idx, n):
    """The reference: the whole sequence through model(...) at every step, argmax."""
    for _ in range(n):
        idx = torch.cat([idx, model(idx)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


def assert_generation_follows_the_forward(model, changed_from=None):
    for use_cache in (True, False):
        got = generate(model, prompt(), NEW, temperature=0, use_cache=use_cache)
        assert torch.equal(got, greedy_by_full_forwards(model, prompt(), NEW)), use_cache
    if changed_from is not None:  # the change matters: without it the tokens differ
        assert not torch.equal(got, changed_from)


@pytest.fixture(scope="module")
def untouched(tiny_model):
    return generate(tiny_model(**SIZES), prompt(), NEW, temperature=0)


def test_a_forward_hook_on_a_block_applies_while_generating(untouched, tiny_model):
    model = tiny_model(**SIZES)
    handle = model.h[1].register_forward_hook(lambda module, args, out: -out)
    try:
        assert_generation_follows_the_forward(model, changed_from=untouched)
    finally:
        handle.remove()
    assert torch.equal(generate(model, prompt(), NEW, temperature=0), untouched)


def test_a_forward_hook_on_an_mlp_applies_while_generating(untouched, tiny_model):
    model = tiny_model(**SIZES)
    handle = model.h[0].mlp.register_forward_hook(lambda module, args, out: out * 30)
    try:
        assert_generation_follows_the_forward(model, changed_from=untouched)
    finally:
        handle.remove()


def test_generate_honours_ablated_heads(tiny_model):
    """Inside ablated_heads, cached generation equals the ablated forward."""
    model = tiny_model(**SIZES)
    with torch.no_grad():  # heads that matter: the ablation then changes the greedy tokens
        for block in model.h:
            block.attn.c_proj.weight.mul_(10)
    untouched = generate(model, prompt(), NEW, temperature=0)
    every_head = {layer: list(range(model.config.n_head)) for layer in range(model.config.n_layer)}
    with ablated_heads(model, every_head):
        assert_generation_follows_the_forward(model, changed_from=untouched)
    with ablated_heads(model, {1: [0]}):
        assert_generation_follows_the_forward(model, changed_from=untouched)
    assert torch.equal(generate(model, prompt(), NEW, temperature=0), untouched)


def test_a_replaced_module_forward_applies_while_generating(untouched, tiny_model):
    model = tiny_model(**SIZES)
    mlp = model.h[2].mlp
    real = mlp.forward
    mlp.forward = lambda x: real(x) * -3  # an instance attribute, as an experimenter patches it
    try:
        assert_generation_follows_the_forward(model, changed_from=untouched)
    finally:
        del mlp.forward


def test_every_block_runs_at_least_once_per_new_token(tiny_model):
    model = tiny_model(**SIZES)
    calls = [0] * model.config.n_layer
    handles = [
        block.register_forward_hook(lambda m, a, o, i=i: calls.__setitem__(i, calls[i] + 1))
        for i, block in enumerate(model.h)
    ]
    try:
        for use_cache in (True, False):
            calls[:] = [0] * model.config.n_layer
            generate(model, prompt(), NEW, temperature=0, use_cache=use_cache)
            assert all(n >= NEW for n in calls), (use_cache, calls)
    finally:
        for handle in handles:
            handle.remove()


class SeenBlock(Block):
    """A learner's subclass: it must run, with the cache handed to it."""

    def forward(self, x, kv_cache=None):
        self.caches = getattr(self, "caches", []) + [kv_cache is not None]
        return super().forward(x, kv_cache=kv_cache)


class NoCacheBlock(Block):
    """A chapter-5 block written without a kv_cache argument."""

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def test_a_learners_block_runs_with_the_cache(tiny_model):
    model = tiny_model(model_kwargs={"block_cls": SeenBlock}, **SIZES)
    got = generate(model, prompt(), NEW, temperature=0)
    assert all(model.h[0].caches)  # every call had the cache
    assert len(model.h[0].caches) == NEW  # the prefill, then one call per step
    assert torch.equal(got, greedy_by_full_forwards(model, prompt(), NEW))


def test_a_block_without_kv_cache_falls_back_to_full_forwards(tiny_model):
    model = tiny_model(model_kwargs={"block_cls": NoCacheBlock}, **SIZES)
    reference = tiny_model(**SIZES)  # the same weights (same seed): Block's arithmetic
    got = generate(model, prompt(), NEW, temperature=0)
    assert torch.equal(got, generate(reference, prompt(), NEW, temperature=0))


def test_from_pretrained_model_cls_is_what_generates(tmp_path, tiny_model):
    from gpt2lib.checkpoint import save_pretrained
    from gpt2lib.model import from_pretrained

    save_pretrained(tiny_model(**SIZES), tmp_path / "m")

    class Counting(ChapterGPT2):
        calls = 0

        def forward(self, idx, kv_cache=None, last_only=False):
            type(self).calls += 1
            return super().forward(idx, kv_cache=kv_cache, last_only=last_only)

    model = from_pretrained(tmp_path / "m", model_cls=Counting).eval()
    assert isinstance(model, Counting)  # with the methods added (gpt2lib.model.with_methods)
    model.generate(prompt(), 4, temperature=0)
    assert type(model).calls == 4


def test_two_threads_generating_on_one_eval_model_get_the_results_of_one_alone(tiny_model):
    model = tiny_model(**SIZES)
    want = {seed: generate(model, prompt(seed=seed), NEW, temperature=0) for seed in (1, 2)}
    got, errors = [], []

    def run(seed):
        try:
            for _ in range(4):
                got.append((seed, generate(model, prompt(seed=seed), NEW, temperature=0)))
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(got) == 8
    assert all(torch.equal(out, want[seed]) for seed, out in got)
    assert not model.training


def test_bad_token_ids_are_refused_before_the_model_runs(tiny_model):
    model = tiny_model(**SIZES)
    handle = model.register_forward_pre_hook(lambda *a: pytest.fail("the model ran"))
    try:
        with pytest.raises(ValueError, match="97"):
            generate(model, torch.tensor([[1, 2, 97]]), 3)
        with pytest.raises(ValueError):
            generate(model, torch.tensor([[1, -1]]), 3)
    finally:
        handle.remove()


# --------------------------------------------------------------------------- the methods


def test_the_methods_equal_the_functions(tmp_path, tiny_model):
    from gpt2lib import GPT2, inspection
    from gpt2lib.checkpoint import save_pretrained
    from gpt2lib.model import from_pretrained

    model = tiny_model(model_cls=GPT2, **SIZES)
    assert isinstance(model, ChapterGPT2) and type(model) is not ChapterGPT2
    ids = prompt()
    assert torch.equal(
        model.generate(ids, 6, temperature=0), generate(model, ids, 6, temperature=0)
    )
    assert torch.equal(model.generate(ids, 6, seed=3), generate(model, ids, 6, seed=3))
    logits, cache = model.run_with_cache(ids)
    want_logits, want_cache = inspection.run_with_cache(model, ids)
    assert torch.equal(logits, want_logits) and len(cache.resid) == len(want_cache.resid)
    assert all(torch.equal(a, b) for a, b in zip(cache.resid, want_cache.resid))
    model.save_pretrained(tmp_path / "methods")
    save_pretrained(model, tmp_path / "function")
    config = "config.json"
    assert (tmp_path / "methods" / config).read_bytes() == (
        tmp_path / "function" / config
    ).read_bytes()
    # the safetensors header's key order is not fixed from one save to the next: compare contents
    from safetensors import safe_open

    saved = []
    for folder in ("methods", "function"):
        with safe_open(tmp_path / folder / "model.safetensors", framework="pt") as f:
            saved.append((f.metadata(), {k: f.get_tensor(k) for k in f.keys()}))
    (meta_a, tensors_a), (meta_b, tensors_b) = saved
    assert meta_a == meta_b and tensors_a.keys() == tensors_b.keys()
    assert all(torch.equal(tensors_a[k], tensors_b[k]) for k in tensors_a)
    loaded = GPT2.from_pretrained(tmp_path / "methods")
    assert type(loaded) is GPT2  # the class it was called on
    plain = from_pretrained(tmp_path / "methods")
    for (name, a), (_, b) in zip(loaded.state_dict().items(), plain.state_dict().items()):
        assert torch.equal(a, b), name
    assert torch.equal(
        loaded.eval().generate(ids, 6, temperature=0), generate(plain.eval(), ids, 6, temperature=0)
    )


def test_chapter_6s_class_has_none_of_the_methods_and_a_learners_class_can_mix_them_in(tiny_model):
    from gpt2lib.model import GPT2Methods

    for method in ("from_pretrained", "generate", "save_pretrained", "run_with_cache"):
        assert not hasattr(ChapterGPT2, method), method

    class MyGPT2(nn.Module):  # a learner's own model, with a forward of its own
        def __init__(self, config):
            super().__init__()
            self.inner = ChapterGPT2(config)
            self.config = config

        def forward(self, idx):
            return self.inner(idx)

    class Mine(MyGPT2, GPT2Methods):
        pass

    mine = tiny_model(model_cls=Mine, **SIZES)
    reference = tiny_model(**SIZES)  # the same weights (the same seed)
    assert torch.equal(
        mine.generate(prompt(), 5, temperature=0), generate(reference, prompt(), 5, temperature=0)
    )
