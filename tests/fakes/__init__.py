"""Faithful stand-ins for services the tests talk to (the Hugging Face Hub)."""
