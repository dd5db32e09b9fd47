"""The weights alone: `state_dict` (torch.save) and `safetensors`, loaded into the same network by name."""

from __future__ import annotations

from pathlib import Path

from trainer.core.catalog import BUILTIN_MODELS


def write_state_dict(model, path: Path, context) -> None:
    import torch

    torch.save(model.state_dict(), path)


def write_safetensors(model, path: Path, context) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))


def _network(meta: dict):
    from trainer.core.config import ModelConfig
    from trainer.model.models import create_model

    return create_model(ModelConfig(name=meta["model_name"]), len(meta["classes"])).eval()


def _loaded(model, state: dict, path: Path):
    """`model` with `state` in it, once every tensor fits (a mismatch names the tensors, not "damaged")."""
    from trainer.model.weights import check_weights_fit

    check_weights_fit(model, state, path, head_module=None, key="weights")
    model.load_state_dict(state)
    return model


def load_state_dict(path: Path, meta: dict):
    from trainer.model.checkpoint import load_weights_only

    return _loaded(_network(meta), load_weights_only(path), path)


def load_safetensors(path: Path, meta: dict):
    from safetensors.torch import load_file

    return _loaded(_network(meta), load_file(str(path)), path)


def _model_lines(model_name: str, classes: int) -> tuple[str, str]:
    """(import, construction) of the network a weights-only export loads into."""
    if model_name.startswith("timm:"):
        return "import timm, torch", f'model = timm.create_model("{model_name[5:]}", num_classes={classes}).eval()'
    if ":" in model_name or model_name in BUILTIN_MODELS:
        where = f" ({BUILTIN_MODELS[model_name]})" if model_name in BUILTIN_MODELS else ""
        return "import torch", f"model = YourNetwork(num_classes={classes}).eval()  # {model_name}'s class{where}"
    return ("import torch, torchvision",
            f'model = torchvision.models.get_model("{model_name}", num_classes={classes}).eval()')


def snippets_state_dict(name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    imports, build = _model_lines(model_name, classes)
    return {"PyTorch (Python)": f'{imports}\n{build}\nmodel.load_state_dict(torch.load("{name}", weights_only=True))'}


def snippets_safetensors(name: str, model_name: str, classes: int, shape: tuple[int, int]) -> dict[str, str]:
    imports, build = _model_lines(model_name, classes)
    return {"PyTorch + safetensors (Python)": f"{imports}\nfrom safetensors.torch import load_file\n{build}\n"
                                              f'model.load_state_dict(load_file("{name}"))'}
