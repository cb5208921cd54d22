"""carina's command line: one Typer app; subsystems' sub-apps load lazily."""
