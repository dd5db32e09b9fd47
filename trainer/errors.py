"""The one base of every refusal of the user's input. Torch-free.

An `InputError` names the file, key or value at fault in its message. The command line prints that message alone
(no traceback) and exits 2; a run that meets one ends `failed` with exit 2 and the message as its reason.
"""


class InputError(Exception):
    """The user's input (a file, folder, key or value, named in the message) is at fault."""

    def __str__(self) -> str:
        # never an empty line for the user (an exception raised without a message still says what it is)
        return super().__str__() or type(self).__name__
