"""Chapter 9's playground: a prompt, sampling sliders and a Generate button, streaming into a box.

Hand-written course tooling (not generated). The sliders need a browser: a kernel that
JupyterLab (jupyter_server) started knows its notebook's session; one started by nbconvert,
nbval or `course progress` does not, and no browser will ever answer the widgets, so there
`playground` prints one sample at the sliders' starting settings and creates no widget.
"""

from __future__ import annotations

import os

__all__ = ["in_a_browser", "playground"]

START = dict(prompt="The meaning of life is", temperature=0.8, top_k=40, top_p=0.95, seed=0)


def in_a_browser() -> bool:
    """Whether a browser front end is attached to this kernel (JupyterLab sets the variable)."""
    return bool(os.environ.get("JPY_SESSION_NAME"))


def _stream(model, tokenizer, prompt, new_tokens, temperature, top_k, top_p, seed):
    from gpt2lib.generation import stream_text

    pieces = stream_text(
        model,
        tokenizer,
        prompt,
        new_tokens,
        temperature=temperature,
        top_k=top_k or None,
        top_p=top_p,
        seed=seed,
    )  # checks now
    print(prompt, end="")
    for piece in pieces:
        print(piece, end="", flush=True)
    print()


def playground(model, tokenizer, new_tokens: int = 30) -> None:
    """Show the widgets (in a browser) or print one sample (anywhere else)."""
    if not in_a_browser():
        _stream(
            model,
            tokenizer,
            START["prompt"],
            new_tokens,
            START["temperature"],
            START["top_k"],
            START["top_p"],
            START["seed"],
        )
        print("(no browser attached: open this notebook in JupyterLab for the sliders)")
        return
    import ipywidgets as widgets
    from IPython.display import display

    prompt = widgets.Textarea(
        value=START["prompt"], description="prompt", layout=widgets.Layout(width="80%")
    )
    temperature = widgets.FloatSlider(
        value=START["temperature"], min=0.0, max=2.0, step=0.05, description="temperature"
    )
    top_k = widgets.IntSlider(value=START["top_k"], min=0, max=200, description="top_k (0: off)")
    top_p = widgets.FloatSlider(
        value=START["top_p"], min=0.05, max=1.0, step=0.05, description="top_p"
    )
    length = widgets.IntSlider(value=new_tokens, min=1, max=300, description="new tokens")
    seed = widgets.IntText(value=START["seed"], description="seed")
    button = widgets.Button(description="Generate", button_style="primary")
    output = widgets.Output(layout=widgets.Layout(border="1px solid #ccc", padding="4px"))

    def run(_=None):
        output.clear_output()
        with output:
            try:
                _stream(
                    model,
                    tokenizer,
                    prompt.value,
                    length.value,
                    temperature.value,
                    top_k.value,
                    top_p.value,
                    seed.value,
                )
            except (ValueError, TypeError) as error:  # a setting generate refuses: say which
                print("⚠️", error)

    button.on_click(run)
    display(widgets.VBox([prompt, temperature, top_k, top_p, length, seed, button, output]))
    run()
