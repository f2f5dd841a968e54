"""Subcommands of the ``xmesh`` command line; each module defines ``add_parser(subparsers)``."""
