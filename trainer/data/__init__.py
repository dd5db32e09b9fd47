"""Datasets: the scan of an ImageFolder (and a folder's own train/val/test splits, and the one walker of user
folders), the exclude/relabel manifest, settings suggested from a scan, the demo dataset, the decoded-image cache and
the loader (batches, splits, augmentation on whole batches).

May import `core`. Torch only in `cache` and `loader`.
"""
