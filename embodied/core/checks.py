"""Argument checks shared by constructors, with errors that name the owner
and the argument."""


def integers(owner, least, **values):
    """Raises a ValueError unless every value is a whole number >= `least`;
    `owner` and the keyword name the argument in the message."""
    for name, value in values.items():
        if int(value) != value or value < least:
            raise ValueError(
                f'{owner}: {name} must be an integer >= {least}, '
                f'got {value!r}.')


def choice(owner, name, value, options):
    """Raises a ValueError naming `owner` unless `value` is in `options`."""
    if value not in options:
        raise ValueError(
            f"Unknown {owner} {name} '{value}': choose one of "
            f"{', '.join(options)}.")
