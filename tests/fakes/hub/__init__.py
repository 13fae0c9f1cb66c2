"""A loopback Hugging Face Hub: auth, LFS, preupload, commits and injected faults (see :mod:`.server`)."""

from tests.fakes.hub.server import HubServer

__all__ = ["HubServer"]
