"""Networks and their weights: building any model (built-in, torchvision, timm, the user's own), pretrained
weights (download with progress, the cache, local files), checkpoints (layout, atomic writes, weights-only loads)
and the moving average of the weights.

May import `core` and `data`.
"""
