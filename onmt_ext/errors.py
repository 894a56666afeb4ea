"""Mistakes of the user, told in one line: :class:`UserError` (exit 1) and :class:`UsageError` (exit 2).

Raised anywhere inside an OpenNMT-py command; the command wrapper (:func:`onmt_ext.integration.commands._run_command`)
writes ``<command>: error: <message>`` and exits with the error's ``status``.  :func:`user_error` makes one that
is also of the type stock raised there, so that code outside the commands catches what it caught before.
"""


class UserError(SystemExit):
    """A mistake in the user's input or environment, found at run time: ``<command>: error: ...``, exit 1.

    The command's name is added by the command wrapper (:func:`onmt_ext.integration.commands._run_command`).
    """

    status = 1

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class UsageError(UserError):
    """A mistake in the command line or config (an option or a path that names nothing): exit 2."""

    status = 2


_USER_ERRORS_ALSO = {}


def user_error(message, stock_type):
    """A :class:`UserError` that is also a ``stock_type`` (what stock raises there), so that code outside the
    commands catches it as before; a plain :class:`UserError` where Python cannot combine the two."""
    if stock_type not in _USER_ERRORS_ALSO:
        try:
            _USER_ERRORS_ALSO[stock_type] = type(f"UserError_{stock_type.__name__}", (UserError, stock_type),
                                                 {"__module__": __name__})
        except TypeError:  # "instance lay-out conflict" (OSError, AttributeError)
            _USER_ERRORS_ALSO[stock_type] = UserError
    return _USER_ERRORS_ALSO[stock_type](message)
