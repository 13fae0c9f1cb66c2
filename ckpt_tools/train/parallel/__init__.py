"""Process groups and device meshes, FSDP2/HSDP/DDP wrapping, mixed precision and PEFT support."""
