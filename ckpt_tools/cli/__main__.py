"""``python -m ckpt_tools.cli``: the same app as the ``ckpt-tools`` entry point."""

from ckpt_tools.cli.app import main

if __name__ == "__main__":
    main()
