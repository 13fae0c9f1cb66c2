from ckpt_tools.train.cli import main

main()
