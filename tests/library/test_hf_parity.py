"""gpt2lib.GPT2 against Hugging Face's GPT2LMHeadModel: same weights in, same logits out.

transformers is a test-only reference. Both models store the Conv1D weights [in, out], and HF's
keys are ours with a `transformer.` prefix, so the weights copy over without any reshaping.
"""

import math

import pytest
import torch

from gpt2lib.chapters.config import GPT2Config
from gpt2lib.chapters.model import GPT2

transformers = pytest.importorskip("transformers")


def _hf_config(config: GPT2Config, attn_implementation: str):
    last = config.vocab_size - 1  # HF warns when its default bos/eos id 50256 is not in the vocab
    hf_config = transformers.GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.n_positions,
        n_embd=config.n_embd,
        n_layer=config.n_layer,
        n_head=config.n_head,
        layer_norm_epsilon=config.layer_norm_epsilon,
        activation_function="gelu_new",  # GPT-2's tanh GELU
        bos_token_id=last,
        eos_token_id=last,
    )
    hf_config._attn_implementation = attn_implementation
    return hf_config


def _randomise(model: GPT2, seed: int) -> None:
    """Weights with every part visible: LayerNorm gains away from 1, biases away from 0."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.copy_(1 + 0.2 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(0.08 * noise)


def _pair(config: GPT2Config, attn_implementation="eager", seed=0, randomise=True, share=False):
    """Our model and HF's, holding the same weights, both in eval mode.

    share=True builds HF's model on the meta device and hands it our tensors (no copy, no
    second initialisation): for the full-size comparison.
    """
    torch.manual_seed(seed)
    ours = GPT2(config).eval()
    if randomise:
        _randomise(ours, seed)
    hf_config = _hf_config(config, attn_implementation)
    if share:
        with torch.device("meta"):
            hf = transformers.GPT2LMHeadModel(hf_config)
    else:
        hf = transformers.GPT2LMHeadModel(hf_config)
    state = {f"transformer.{k}": v for k, v in ours.state_dict().items()}
    result = hf.load_state_dict(state, strict=False, assign=share)
    if share:
        hf.tie_weights()  # lm_head.weight was left on meta; point it at the new wte
    hf.eval()
    assert result.unexpected_keys == []
    # lm_head.weight is HF's tied alias of wte.weight; anything else missing would be a real gap
    assert [k for k in result.missing_keys if not k.endswith(".attn.bias")] in (
        [],
        ["lm_head.weight"],
    )
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr(), "HF readout untied"
    return ours, hf


CONFIGS = {
    # odd sizes: 3 heads of 16, a vocabulary of 101, one block, 8 positions
    "odd-48x3-L1-V101": GPT2Config(vocab_size=101, n_positions=8, n_embd=48, n_layer=1, n_head=3),
    "small-64x4-L3": GPT2Config(vocab_size=257, n_positions=32, n_embd=64, n_layer=3, n_head=4),
    "wide-heads-96x2-L2-eps1e-6": GPT2Config(
        vocab_size=500, n_positions=20, n_embd=96, n_layer=2, n_head=2, layer_norm_epsilon=1e-6
    ),
    "one-head-40x1-L2": GPT2Config(vocab_size=37, n_positions=12, n_embd=40, n_layer=2, n_head=1),
}


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(name, attn_implementation):
    config = CONFIGS[name]
    ours, hf = _pair(config, attn_implementation)
    generator = torch.Generator().manual_seed(1)
    # T = 1, an odd length in between, and the whole context
    for batch, length in [
        (1, 1),
        (2, 1),
        (3, config.n_positions // 2 + 1),
        (2, config.n_positions),
    ]:
        idx = torch.randint(0, config.vocab_size, (batch, length), generator=generator)
        with torch.no_grad():
            got = ours(idx)
            want = hf(idx).logits
        assert got.shape == want.shape == (batch, length, config.vocab_size)
        assert want.abs().max() > 0.5, "logits too small for the comparison to mean much"
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_last_only_matches_the_last_position_of_transformers():
    config = CONFIGS["small-64x4-L3"]
    ours, hf = _pair(config, seed=3)
    idx = torch.randint(0, config.vocab_size, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = ours(idx, last_only=True)
        want = hf(idx).logits[:, -1:]
    assert got.shape == (2, 1, config.vocab_size)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_gradients_match_transformers_including_the_tied_table():
    """The token table gets gradient from the embedding AND the readout, in both models."""
    config = CONFIGS["odd-48x3-L1-V101"]
    ours, hf = _pair(config, seed=4)
    idx = torch.randint(
        0, config.vocab_size, (2, config.n_positions), generator=torch.Generator().manual_seed(5)
    )
    targets = torch.roll(idx, shifts=-1, dims=1)
    loss_ours = torch.nn.functional.cross_entropy(ours(idx).flatten(0, 1), targets.flatten())
    loss_hf = torch.nn.functional.cross_entropy(hf(idx).logits.flatten(0, 1), targets.flatten())
    loss_ours.backward()
    loss_hf.backward()
    torch.testing.assert_close(loss_ours, loss_hf, atol=1e-5, rtol=1e-5)
    hf_params = dict(hf.transformer.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, hf_params[name].grad, atol=1e-5, rtol=1e-4, msg=name)
    unused = sorted(set(range(config.vocab_size)) - set(idx.flatten().tolist()))
    assert unused, "every token id occurs: pick a shorter input"
    # rows of tokens never fed in still get gradient: only the readout can have put it there
    assert ours.wte.weight.grad[unused].abs().sum() > 0


@pytest.mark.slow
def test_full_size_gpt2_small_matches_transformers():
    """One comparison at GPT-2 small's real shapes (124,439,808 parameters), GPT-2's own init."""
    config = GPT2Config()
    ours, hf = _pair(config, "sdpa", randomise=False, share=True)
    assert sum(p.numel() for p in ours.parameters()) == 124_439_808
    assert sum(p.numel() for p in hf.parameters()) == 124_439_808  # HF counts its tied head once
    idx = torch.randint(0, config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        got = ours(idx)
        want = hf(idx).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    loss = torch.nn.functional.cross_entropy(got[0, :-1], idx[0, 1:])
    # at initialisation the model is close to a uniform guess over the vocabulary
    assert abs(loss.item() - math.log(config.vocab_size)) < 0.5
