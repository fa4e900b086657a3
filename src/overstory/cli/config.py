from __future__ import annotations

import click

from overstory.cli._common import echo_json, json_option, project_paths


@click.command(name="config")
@click.option("--defaults", is_flag=True, help="Print the documented default config.yaml.")
@json_option
def config(defaults: bool, as_json: bool) -> None:
    """Show the effective configuration (files plus OV_* overrides).

    \b
    ov config --json
    OV_TURNS_STALL_TIMEOUT=30 ov config
    """
    if defaults:
        from overstory.config.model import DEFAULT_CONFIG_YAML, Config

        if as_json:
            echo_json(Config().model_dump())
        else:
            click.echo(DEFAULT_CONFIG_YAML, nl=False)
        return
    from overstory.config.load import load as load_config

    project = project_paths()
    effective = load_config(project.config_file, project.local_config_file).model_dump()
    if as_json:
        echo_json(effective)
    else:
        import yaml

        click.echo(yaml.safe_dump(effective, sort_keys=False), nl=False)
