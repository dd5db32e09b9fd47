"""The set-up pages as one view of the form model: what each page finds wrong beyond the config's own checks, and
where each problem is marked."""

from __future__ import annotations

from dataclasses import dataclass

from app.pages.advanced_page import AdvancedPage
from app.pages.dataset_page import DatasetPage
from app.pages.device_page import DevicePage
from app.pages.model_page import ModelPage
from app.pages.optimizer_page import OptimizerPage
from app.widgets.forms import Binder


@dataclass
class SetupPages:
    binder: Binder  # the keys with a widget of their own, on the four pages below
    dataset: DatasetPage
    model: ModelPage
    optimizer: OptimizerPage
    device: DevicePage
    advanced: AdvancedPage  # every other key

    def problems(self, raw: dict) -> list[str]:
        """What the pages know stops a run beyond the config's own checks: the folder's scan, the model, the
        parameter groups against the model's parameters, what the device cannot run."""
        optimizer = self.optimizer
        return (self.dataset.problems() + self.model.problems()
                + optimizer.groups.problems(optimizer.head, bool(raw.get("model", {}).get("freeze_backbone")))
                + self.device.problems(raw))

    def mark_errors(self, problems: list[str]) -> None:
        self.binder.mark_errors(problems)
        self.optimizer.groups.mark_errors(problems)
        self.advanced.mark_errors(problems)
