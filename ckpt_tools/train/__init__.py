"""The training core: DDP / FSDP2 / HSDP under torchrun, checkpoints as docs/checkpoint-format.md describes.

Needs the ``training`` extra (torch, accelerate, peft, draccus). Nothing outside this
package may import it.
"""
