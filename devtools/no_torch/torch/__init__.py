# Put this directory first on PYTHONPATH to run a process in which `import torch` fails,
# proving that the tool side of ckpt_tools never needs torch.
raise ImportError("torch is blocked in this process (ckpt_tools tools must not import it)")
