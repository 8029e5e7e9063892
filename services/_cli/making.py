"""`roundtrip keys` and `contracts`: what is made once and handed on, a signing key pair and the generated event
schemas, AsyncAPI document and configuration reference."""

from __future__ import annotations

from typing import Annotated

import typer


def keys(
    purpose: Annotated[
        str,
        typer.Argument(
            help="batch: the gate signs approved batches, executors and the guard verify; decision: the console and "
            "`roundtrip approvals` sign people's decisions, the gate and the guard verify"
        ),
    ],
    key_id: Annotated[
        str | None, typer.Option(help="the id the signatures name (default: the purpose and today's date)")
    ] = None,
) -> None:
    """Make a new Ed25519 key pair and print it as two settings: the private key line for the signer's Secret and
    the public key line for the verifiers (nothing is written anywhere else). Rotate by adding the new public key to
    the verify keys everywhere, then giving the signer the new private key, then dropping the old public key."""
    from roundtrip._cli.keys import Purpose, default_key_id, pair_lines

    if purpose not in tuple(Purpose):
        raise typer.BadParameter(f"unknown purpose {purpose!r}; choose batch or decision")
    try:
        lines = pair_lines(Purpose(purpose), key_id or default_key_id(Purpose(purpose)))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    typer.echo("\n".join(lines))


def contracts() -> None:
    """Regenerate schemas/events/ (event JSON Schemas), contracts/ (AsyncAPI) and the manual's configuration reference
    (docs/reference/configuration.md) from the code, in a checkout."""
    from roundtrip._cli.contracts import NotACheckout, write

    try:
        written = write()
    except NotACheckout as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    for path in written:
        typer.echo(f"wrote {path}")
