"""The model port: where the model service's calls go (ROUNDTRIP_MODEL_PROVIDER), behind one small interface.

Each provider builds the `anthropic` SDK's own client of its platform; all have the same `messages` resource, so
nothing after construction knows the platform, and the SDK signs and authenticates (nothing here signs a request or
mints a token). An adapter holds what differs: its client, the model ids it takes, its GenAI provider name, what its
limiter learns from (`signals`), and `refusal`: at start, one line naming the setting that would otherwise fail every
turn later. Platforms and credentials: docs/operating/model-providers.md.
"""

from __future__ import annotations

import os
import re
from typing import Any, Protocol

import anthropic
from pydantic import SecretStr

from roundtrip._kernel.observability.telemetry import PROVIDER_NAMES
from roundtrip._kernel.settings import ConfigurationError
from roundtrip._model.capacity import HEADERS, REFUSALS, Signals

# a foundation model, a cross-region inference profile (us., eu., global., ...) or an ARN
BEDROCK_MODEL = re.compile(r"^(?:[a-z]{2,6}\.)?anthropic\.claude-[A-Za-z0-9.:-]+$|^arn:aws[a-z-]*:bedrock:\S+$")
VERTEX_MODEL = re.compile(r"^claude-[a-z0-9.-]+(?:@\d{8})?$")
DATED = re.compile(r"-(\d{8})$")  # the Anthropic API's dated id, claude-...-20250929 (Vertex writes @20250929)
VERTEX_REGION = re.compile(r"^(?:global|us|eu|[a-z]+-[a-z]+\d+)$")


class ModelAccess(Protocol):
    """The settings a provider reads: fields of ModelSettings and ModelPlatform, and Settings' endpoint in effect."""

    anthropic_api_key: SecretStr | None
    anthropic_base_url: str | None
    model_timeout_s: float
    model_region: str | None
    vertex_project_id: str | None
    vertex_access_token: SecretStr | None
    foundry_resource: str | None
    foundry_api_key: SecretStr | None
    foundry_entra_id: bool

    @property
    def model_provider(self) -> str: ...

    @property
    def model_base_url(self) -> str | None: ...


class Provider(Protocol):
    name: str
    otel_name: str  # gen_ai.provider.name of the SDK's span of each call
    signals: Signals

    def client(self, settings: ModelAccess, max_retries: int, http_client: Any) -> Any: ...

    def refusal(self, settings: ModelAccess, model: str) -> str | None:
        """Why the model cannot be called as configured (one line naming the setting), or None."""
        ...

    def region(self, settings: ModelAccess) -> str | None: ...


def _secret(value: Any) -> str | None:
    return value.get_secret_value() if value is not None and value.get_secret_value() else None


def _missing_extra(name: str, module: str) -> str | None:
    try:
        __import__(module)
    except ImportError:
        return (
            f"ROUNDTRIP_MODEL_PROVIDER={name} needs {module}, which is not installed: install the package with its "
            f"extra, pip install 'roundtrip-fleet[{name}]'"
        )
    return None


class AnthropicApi:
    name, otel_name = "anthropic", PROVIDER_NAMES["anthropic"]
    signals = HEADERS

    def client(self, settings: ModelAccess, max_retries: int, http_client: Any) -> Any:
        return anthropic.AsyncAnthropic(
            api_key=_secret(settings.anthropic_api_key) or "simulator",
            base_url=settings.model_base_url,
            max_retries=max_retries,
            timeout=settings.model_timeout_s,
            http_client=http_client,
        )

    def refusal(self, settings: ModelAccess, model: str) -> str | None:
        return None  # the API names its models freely; no key: the simulator

    def region(self, settings: ModelAccess) -> str | None:
        return None


class Bedrock:
    name, otel_name = "bedrock", PROVIDER_NAMES["bedrock"]
    signals = REFUSALS

    def region(self, settings: ModelAccess) -> str | None:
        region = settings.model_region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region is None:
            try:
                import boto3

                region = boto3.Session().region_name
            except Exception:  # noqa: BLE001 - no boto3, no profile: no region
                return None
        return region

    def client(self, settings: ModelAccess, max_retries: int, http_client: Any) -> Any:
        return anthropic.AsyncAnthropicBedrock(
            aws_region=self.region(settings),
            base_url=settings.anthropic_base_url or None,
            max_retries=max_retries,
            timeout=settings.model_timeout_s,
            http_client=http_client,
        )

    def refusal(self, settings: ModelAccess, model: str) -> str | None:
        if not BEDROCK_MODEL.match(model):
            return (
                f"ROUNDTRIP_MODEL={model} is not a Bedrock model id: Bedrock takes anthropic.claude-... (e.g. "
                "anthropic.claude-sonnet-4-6), an inference profile (us.anthropic.claude-..., "
                "global.anthropic.claude-...) or an inference profile's ARN"
            )
        if problem := _missing_extra("bedrock", "boto3"):
            return problem
        import boto3

        region = self.region(settings)
        if not region:
            return "ROUNDTRIP_MODEL_REGION is not set (nor AWS_REGION, AWS_DEFAULT_REGION or the profile's region)"
        if region not in _aws_regions(boto3.Session()):
            return f"ROUNDTRIP_MODEL_REGION={region} is not an AWS region (e.g. us-east-1, eu-central-1)"
        if os.environ.get("AWS_BEARER_TOKEN_BEDROCK"):
            return None  # a Bedrock API key: the SDK sends it as a bearer token
        if boto3.Session(region_name=region).get_credentials() is None:
            return (
                "no AWS credentials for Bedrock: give the model service a role (IRSA or EKS pod identity), a profile, "
                "or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        return None


def _aws_regions(session: Any) -> set[str]:
    """Every region botocore's endpoint data knows, in every partition (its list of Bedrock's is not kept current)."""
    return {
        region
        for partition in session.get_available_partitions()
        for region in session.get_available_regions("ec2", partition_name=partition)
    }


class Vertex:
    name, otel_name = "vertex", PROVIDER_NAMES["vertex"]
    signals = REFUSALS

    def region(self, settings: ModelAccess) -> str | None:
        return settings.model_region or os.environ.get("CLOUD_ML_REGION")

    def _project(self, settings: ModelAccess) -> str | None:
        return settings.vertex_project_id or os.environ.get("ANTHROPIC_VERTEX_PROJECT_ID")

    def client(self, settings: ModelAccess, max_retries: int, http_client: Any) -> Any:
        project = self._project(settings)
        return anthropic.AsyncAnthropicVertex(
            region=self.region(settings) or "",
            project_id=project or anthropic.NOT_GIVEN,  # not given: ANTHROPIC_VERTEX_PROJECT_ID, else the credentials'
            access_token=_secret(settings.vertex_access_token),
            base_url=settings.anthropic_base_url or None,
            max_retries=max_retries,
            timeout=settings.model_timeout_s,
            http_client=http_client,
        )

    def refusal(self, settings: ModelAccess, model: str) -> str | None:
        if not VERTEX_MODEL.match(model) or DATED.search(model):
            dated = DATED.search(model)
            example = f"{model[: dated.start()]}@{dated.group(1)}" if dated else "claude-sonnet-4-6"
            return (
                f"ROUNDTRIP_MODEL={model} is not a Vertex AI model id: Vertex takes claude-..., a dated model with its "
                f"date after an @ (e.g. {example})"
            )
        region = self.region(settings)
        if not region:
            return (
                "ROUNDTRIP_MODEL_REGION is not set (nor CLOUD_ML_REGION): the Vertex AI region, e.g. us-east5 or global"
            )
        if not VERTEX_REGION.match(region):
            return f"ROUNDTRIP_MODEL_REGION={region} is not a Vertex AI region (e.g. us-east5, europe-west1, global)"
        if _secret(settings.vertex_access_token):
            if not self._project(settings):
                return "ROUNDTRIP_VERTEX_PROJECT_ID is not set: with an access token the project cannot be inferred"
            return None
        if problem := _missing_extra("vertex", "google.auth"):
            return problem
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError

        try:
            _, project = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        except DefaultCredentialsError:
            return (
                "no Google credentials for Vertex AI: give the model service workload identity, "
                "GOOGLE_APPLICATION_CREDENTIALS, or ROUNDTRIP_VERTEX_ACCESS_TOKEN"
            )
        if not (self._project(settings) or project):
            return "ROUNDTRIP_VERTEX_PROJECT_ID is not set and the credentials name no project"
        return None


class _Foundry(anthropic.AsyncAnthropicFoundry):
    """The SDK's Foundry client, its spans named as the GenAI conventions name Azure AI Foundry's inference."""

    _gen_ai_provider_name = PROVIDER_NAMES["foundry"]


class Foundry:
    name, otel_name = "foundry", PROVIDER_NAMES["foundry"]
    signals = REFUSALS

    def region(self, settings: ModelAccess) -> str | None:
        return None  # the resource says where

    def _resource(self, settings: ModelAccess) -> str | None:
        return settings.foundry_resource or os.environ.get("ANTHROPIC_FOUNDRY_RESOURCE")

    def client(self, settings: ModelAccess, max_retries: int, http_client: Any) -> Any:
        credentials: dict[str, Any] = {"api_key": _secret(settings.foundry_api_key)}
        if settings.foundry_entra_id:
            from azure.identity import DefaultAzureCredential, get_bearer_token_provider

            credentials = {
                "azure_ad_token_provider": get_bearer_token_provider(
                    DefaultAzureCredential(), "https://ai.azure.com/.default"
                )
            }
        where = (
            {"base_url": settings.anthropic_base_url}
            if settings.anthropic_base_url
            else {"resource": self._resource(settings)}
        )
        return _Foundry(
            **credentials,
            **where,
            max_retries=max_retries,
            timeout=settings.model_timeout_s,
            http_client=http_client,
        )

    def refusal(self, settings: ModelAccess, model: str) -> str | None:
        if BEDROCK_MODEL.match(model) or "@" in model:
            return (
                f"ROUNDTRIP_MODEL={model} is not a Foundry model id: Foundry takes the deployment's name, by default "
                "the model's (e.g. claude-sonnet-4-6)"
            )
        if not (settings.anthropic_base_url or self._resource(settings)):
            return "ROUNDTRIP_FOUNDRY_RESOURCE is not set (nor ANTHROPIC_FOUNDRY_RESOURCE): the Foundry resource's name"
        if settings.foundry_entra_id:
            return _missing_extra("foundry", "azure.identity")
        if not (_secret(settings.foundry_api_key) or os.environ.get("ANTHROPIC_FOUNDRY_API_KEY")):
            return (
                "ROUNDTRIP_FOUNDRY_API_KEY is not set (nor ANTHROPIC_FOUNDRY_API_KEY), nor ROUNDTRIP_FOUNDRY_ENTRA_ID"
            )
        return None


PROVIDERS: dict[str, Provider] = {p.name: p for p in (AnthropicApi(), Bedrock(), Vertex(), Foundry())}


def of(settings: ModelAccess) -> Provider:
    return PROVIDERS[settings.model_provider]


def refuse_unusable(settings: ModelAccess, model: str) -> None:
    if problem := of(settings).refusal(settings, model):
        raise ConfigurationError(f"model refuses to start: {problem}")


def in_effect(settings: ModelAccess) -> list[tuple[str, str]]:
    """What `roundtrip config` shows of the model's platform as the service would reach it, no credential among it."""
    from roundtrip._kernel.settings.display import without_passwords

    provider = of(settings)
    endpoint = settings.model_base_url if provider.name == "anthropic" else settings.anthropic_base_url
    return [
        ("provider", provider.name),
        ("region", provider.region(settings) or "(none)"),
        ("endpoint", without_passwords(endpoint) if endpoint else "(the platform's own)"),
    ]
