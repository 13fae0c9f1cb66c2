from ckpt_tools.cli.app import main

main()
