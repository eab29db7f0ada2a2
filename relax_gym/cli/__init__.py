"""The ``relax-gym`` command line; each subcommand lives in its own module, imported lazily."""
