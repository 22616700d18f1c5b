"""``rmq keys``: CURVE key files for rmq.security (zmq.auth.create_certificates format)."""
from __future__ import annotations

import click


@click.group("keys")
def keys() -> None:
    """CURVE key pairs: NAME.key (public, give it out) and NAME.key_secret (keep it)."""


@keys.command("generate")
@click.argument("name")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Directory for NAME.key and NAME.key_secret (created 0700).")
def generate(name: str, directory: str) -> None:
    """Write NAME.key (public) and NAME.key_secret (secret, mode 0600); never overwrites.

    Server: authServerKeyFile=DIR/NAME.key_secret.  Clients: copy NAME.key into the broker's
    authClientKeysDir (or authAdminKeysDir for admin tools) and use NAME.key_secret with
    RMQ_AUTH_CLIENT_KEY / `rmq admin --auth-key`."""
    from rmq.security import SecurityError, generate_keys
    try:
        pub, sec = generate_keys(name, directory)
    except SecurityError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"public key: {pub}")
    click.echo(f"secret key: {sec}")
