"""Consumers: the ledger's stages (processor, authority kernel, relay) and their runtime."""
