"""python -m gpt2lib.speed tune: measure this machine's fastest few-row multiplies and keep them.

Generation on a CPU then takes the split multiplies where they pay (gpt2lib.speed); without a
measurement it uses PyTorch's own, and it never measures by itself.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args != ["tune"]:
        print("error: usage: python -m gpt2lib.speed tune", file=sys.stderr)
        return 2
    import torch

    from gpt2lib.speed import kernels, tune

    routes = tune()
    print(f"measured at {torch.get_num_threads()} threads, kept in {kernels.routes_file()}:")
    for name, route in sorted(routes.items()):
        print(f"  {name}: {route}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
