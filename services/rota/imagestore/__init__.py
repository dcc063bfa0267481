"""Checkpoint images on disk: the content-addressed chunk store, the image format and its settings.

A library, not a service: the node agents write and restore images through it (the data
path stays on the node), and the checkpoint service, which owns the images' metadata
(`checkpoint_images`, `checkpoint_manifests`, `checkpoint_operations`), collects chunks
through it. Neither imports the other.
"""
