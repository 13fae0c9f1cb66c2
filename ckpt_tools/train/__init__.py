"""The training core: DDP / FSDP2 / HSDP under torchrun, checkpoints in the layout of SPEC §4.

Needs the ``training`` extra (torch, accelerate, peft, draccus). Nothing outside this
package may import it.
"""
