"""The one base of every refusal of the user's input. Torch-free.

An `InputError` names the file, key or value at fault in its message. The command line prints that message alone
(no traceback) and exits 2; a run that meets one ends `failed` with exit 2 and the message as its reason.
"""


class InputError(Exception):
    """The user's input (a file, folder, key or value, named in the message) is at fault."""

    def __str__(self) -> str:
        # never an empty line for the user (an exception raised without a message still says what it is)
        return super().__str__() or type(self).__name__


def first_line(e: BaseException, limit: int = 200) -> str:
    """`TypeName: first line of the message`, for one-line errors (an exception without a message gives its type)."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:limit]}" if text else type(e).__name__


def refusals(output: str) -> str:
    """What a `main.py` command's output says it refused: its `error:` lines, joined ("" when it said none)."""
    return "; ".join(line.removeprefix("error: ") for line in output.splitlines() if line.startswith("error: "))


class ModelError(InputError, ValueError):
    """A model that cannot be built or loaded; the message names the key or file."""
