from .errors import interrupted_while_starting

try:
    from .cli import command
except KeyboardInterrupt:
    interrupted_while_starting()

command()
