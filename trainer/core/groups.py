"""Assigning parameters to optimizer groups by module-name pattern.

Torch-free, so the app's parameter-groups editor shows exactly the assignment the trainer will use.
A group's pattern matches a parameter when it matches the parameter's module name (`layer4.0.conv1`)
or the parameter's own name (`layer4.0.conv1.weight`) with fnmatch, or names a module that contains it
(`layer4` contains `layer4.0.conv1`). The first matching group wins; unmatched parameters stay in the
default group.
"""

from __future__ import annotations

from fnmatch import fnmatchcase


def pattern_matches(pattern: str, param_name: str) -> bool:
    module = param_name.rpartition(".")[0]
    return (fnmatchcase(module, pattern) or fnmatchcase(param_name, pattern)
            or module.startswith(pattern + ".") or module == pattern)


def is_head_parameter(head: str | None, key: str) -> bool:
    """Whether parameter `key` belongs to the classifier head module `head` (`trainer.model.models.head_name`)."""
    return head is not None and key.rpartition(".")[0] == head


def grouped_parameters(param_names: list[str], head: str | None, freeze_backbone: bool) -> list[str]:
    """The parameters the optimizer's groups are matched against: every trainable one; with
    `model.freeze_backbone`, the classifier head's alone (the backbone does not train)."""
    if not freeze_backbone:
        return list(param_names)
    return [n for n in param_names if is_head_parameter(head, n)]


def group_problems(param_names: list[str], patterns: list[str], head: str | None = None,
                   freeze_backbone: bool = False) -> list[str]:
    """A message for each group that would receive no parameter, against the parameters the trainer really groups
    (freezing applied): the pre-flight's check and the app's parameter-groups editor's."""
    grouped = grouped_parameters(param_names, head, freeze_backbone)
    unmatched_anyway = set(unmatched_patterns(param_names, patterns))
    out = []
    for i in unmatched_patterns(grouped, patterns):
        if not patterns[i]:
            continue
        if freeze_backbone and i not in unmatched_anyway:
            out.append(f"optimizer.groups[{i}].pattern: {patterns[i]!r} matches only backbone parameters, and "
                       f"model.freeze_backbone trains the head ({head or 'none'}) alone; remove the group or "
                       f"unfreeze the backbone")
        else:
            out.append(unmatched_message(i, patterns[i], grouped or param_names))
    return out


def next_pattern(param_names: list[str], patterns: list[str], head: str | None = None) -> str:
    """What a new group should start with: the head, else the first top-level module, whose parameters no group has
    yet (a pattern that would receive parameters); "" when every module has a group."""
    assignment = assign_groups(param_names, patterns)
    free = [name for name, index in zip(param_names, assignment) if index is None]
    if head and any(is_head_parameter(head, name) for name in free):
        return head
    return free[0].split(".")[0] if free else ""


def assign_groups(param_names: list[str], patterns: list[str]) -> list[int | None]:
    """For each parameter, the index of the first group whose pattern matches it, or None."""
    out: list[int | None] = []
    for name in param_names:
        out.append(next((i for i, p in enumerate(patterns) if pattern_matches(p, name)), None))
    return out


def unmatched_patterns(param_names: list[str], patterns: list[str]) -> list[int]:
    """Indices of groups that receive no parameter: a typo, or an earlier group took all they match."""
    taken = set(assign_groups(param_names, patterns))
    return [i for i in range(len(patterns)) if i not in taken]


def unmatched_message(index: int, pattern: str, param_names: list[str]) -> str:
    return (f"optimizer.groups[{index}].pattern: {pattern!r} matches no parameter, or only ones an earlier group "
            f"took (module names look like: {module_examples(param_names)})")


def module_examples(param_names: list[str], limit: int = 8) -> str:
    """A few top-level module names, for error messages."""
    seen: list[str] = []
    for name in param_names:
        top = name.split(".")[0]
        if top not in seen:
            seen.append(top)
    return ", ".join(seen[:limit]) + (", ..." if len(seen) > limit else "")
