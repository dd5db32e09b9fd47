"""Using a trained network: inference (the one path from a checkpoint or an export to logits), evaluation,
Grad-CAM, exports and their measurement, int8 quantization, mobile formats and the model card.

May import `core`, `data`, `model` and `device`.
"""
