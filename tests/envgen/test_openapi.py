"""OpenAPI → EnvMetadata: the shipped pharmacy and parcel specs, an inline doc with $ref cycles, errors."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from envfactory.env.metadata import EnvMetadata, dump_metadata, load_metadata
from envfactory.envgen.openapi import OpenAPIError, identifier, openapi_to_metadata, snake_case
from envfactory.errors import MetadataError
from tests.support.paths import ROOT

PHARMACY = ROOT / "sources" / "pharmacy_prescriptions.openapi.yaml"
PARCEL = ROOT / "sources" / "parcel_tracking.openapi.json"

INLINE: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "Category Store", "version": "1"},
    "paths": {
        "/categories/{categoryId}": {
            "parameters": [{"name": "categoryId", "in": "path", "schema": {"type": "string"}}],
            "get": {
                "operationId": "getCategory",
                "summary": "Get a category",
                "description": "With its parent and children.",
                "responses": {
                    "200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Category"}}}}
                },
            },
            "put": {
                "operationId": "HTTPUpdate.category",
                "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewItem"}}}},
                "responses": {"204": {"description": "updated"}},
            },
        },
        "/categories/{categoryId}/items": {
            "get": {
                "parameters": [
                    {"name": "categoryId", "in": "path", "required": True, "schema": {"type": "string"}},
                    {"name": "page-size", "in": "query", "schema": {"type": "int"}},
                    {"name": "X-Trace", "in": "header", "required": True, "schema": {"type": "string"}},
                    {"name": "session", "in": "cookie", "schema": {"type": "string"}},
                ],
                "responses": {
                    "2XX": {
                        "content": {
                            "application/hal+json": {
                                "schema": {"type": "array", "items": {"$ref": "#/components/schemas/Item"}}
                            }
                        }
                    }
                },
            },
            "post": {
                "operationId": "getCategory",  # a duplicate id: the tool name gets a suffix
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": {"type": "array", "items": {"type": "string"}}}},
                },
                "responses": {"201": {"content": {"application/json": {"schema": {"type": "string"}}}}},
            },
        },
    },
    "components": {
        "schemas": {
            "Category": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "parent": {"$ref": "#/components/schemas/Category"},
                    "children": {"type": "array", "items": {"$ref": "#/components/schemas/Category"}},
                    "note": {"type": "string", "nullable": True, "example": "seasonal", "xml": {"name": "n"}},
                },
            },
            "Item": {
                "allOf": [
                    {"$ref": "#/components/schemas/NewItem"},
                    {"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}},
                ]
            },
            "NewItem": {
                "type": "object",
                "required": ["title"],
                "properties": {"title": {"type": "string"}, "price": {"type": "number"}, "class": {"type": "string"}},
            },
        }
    },
}


def _tools(meta: EnvMetadata) -> dict[str, Any]:
    return {t.name: t for t in meta.tools}


def test_pharmacy_openapi_converts_to_valid_metadata(tmp_path: Path) -> None:
    meta = openapi_to_metadata(PHARMACY, domain="lifestyle")
    assert meta.name == "corner_pharmacy_prescriptions_api" and meta.domain == "lifestyle"
    assert meta.description.startswith("Prescriptions and refills") and meta.source == f"openapi:{PHARMACY.name}"
    tools = _tools(meta)
    assert set(tools) == {
        "search_pharmacies",
        "list_prescriptions",
        "get_prescription",
        "request_refill",
        "transfer_prescription",
        "get_refill",
        "cancel_refill",
        "check_interactions",
    }
    kinds = {name: t.kind for name, t in tools.items()}
    assert {n for n, k in kinds.items() if k == "read"} == {
        "search_pharmacies",
        "list_prescriptions",
        "get_prescription",
        "get_refill",
    }

    # query parameters, with required and defaults
    search = tools["search_pharmacies"]
    assert search.required == ["postcode"] and search.parameters["open_now"] == {
        "type": "boolean",
        "default": False,
        "description": "Only stores open at the moment of the request.",
    }
    # a path parameter from components/parameters via $ref, snake_cased
    listing = tools["list_prescriptions"]
    assert listing.required == ["patient_id"] and listing.parameters["status"]["enum"] == [
        "active",
        "expired",
        "transferred",
    ]
    # path-level parameters + an optional header + a $ref'd JSON body
    refill = tools["request_refill"]
    assert list(refill.parameters) == ["prescription_id", "idempotency_key", "pickup_pharmacy_id", "notes"]
    assert refill.required == ["prescription_id", "pickup_pharmacy_id"]
    assert refill.parameters["notes"] == {"type": "string", "maxLength": 500}
    assert tools["transfer_prescription"].required == ["prescription_id", "target_pharmacy_id"]
    assert tools["check_interactions"].parameters["medication_codes"]["items"]["type"] == "string"
    assert tools["get_refill"].description == "Follow a refill"
    assert tools["request_refill"].description.startswith("Request a refill. Fails with 409")

    # the 2xx JSON response, refs inlined; 3.0 `nullable` becomes a null type; `example` becomes `examples`
    out = tools["get_prescription"].output_schema
    assert out is not None and out["type"] == "object" and "medication" in out["required"]
    assert out["properties"]["medication"]["properties"]["name"] == {"type": "string", "examples": ["Amoxicillin"]}
    assert out["properties"]["last_filled_on"] == {"type": ["string", "null"], "format": "date"}
    assert tools["request_refill"].output_schema["properties"]["status"]["enum"][0] == "queued"
    pharmacies = tools["search_pharmacies"].output_schema
    assert pharmacies is not None and pharmacies["type"] == "array"
    assert pharmacies["items"]["properties"]["address"]["properties"]["postcode"] == {"type": "string"}

    # what it writes is a loadable metadata.json
    dump_metadata(meta, tmp_path / "metadata.json")
    assert load_metadata(tmp_path / "metadata.json") == meta


def test_openapi_31_json_keeps_type_lists() -> None:
    meta = openapi_to_metadata(PARCEL, name="parcels", domain="utilities", description="Parcel shipping.")
    assert (meta.name, meta.description) == ("parcels", "Parcel shipping.")
    tools = _tools(meta)
    create = tools["create_shipment"]
    assert create.kind == "write" and create.required == ["sender", "recipient", "weight_kg", "service"]
    assert create.parameters["declared_value"]["type"] == ["number", "null"]
    assert create.parameters["service"] == {"type": "string", "enum": ["economy", "standard", "next_day", "same_day"]}
    assert create.parameters["sender"]["properties"]["line2"]["type"] == ["string", "null"]
    assert tools["redirect_shipment"].required == ["tracking_number"]
    assert tools["get_shipment"].parameters["tracking_number"]["pattern"].startswith("^SP")
    assert tools["list_tracking_events"].output_schema["items"]["properties"]["at"]["format"] == "date-time"


def test_inline_doc_with_refs_bodies_path_params_and_a_cycle() -> None:
    doc = copy.deepcopy(INLINE)
    meta = openapi_to_metadata(doc, domain="commerce")
    assert doc == INLINE  # the input is not modified
    assert (
        meta.name == "category_store"
        and meta.description == "Category Store"
        and meta.source == "openapi:Category Store"
    )
    tools = _tools(meta)
    assert list(tools) == ["get_category", "http_update_category", "get_categories_category_id_items", "get_category_2"]

    get = tools["get_category"]
    assert get.kind == "read" and get.required == ["category_id"]  # path parameters are always required
    assert get.description == "Get a category. With its parent and children."
    out = get.output_schema
    assert out is not None and out["required"] == ["name"]
    # the recursive reference is cut with a stub instead of looping forever
    assert out["properties"]["parent"] == {"type": "object", "description": "recursive reference to Category"}
    assert out["properties"]["children"]["items"] == out["properties"]["parent"]
    assert out["properties"]["note"] == {"type": ["string", "null"], "examples": ["seasonal"]}  # xml dropped

    update = tools["http_update_category"]
    assert update.kind == "write" and update.output_schema is None  # 204: no body
    assert list(update.parameters) == ["category_id", "title", "price", "class_"]  # a keyword made an identifier
    assert update.required == ["category_id", "title"]

    items = tools["get_categories_category_id_items"]
    assert list(items.parameters) == ["category_id", "page_size", "x_trace"]  # cookies are not tool inputs
    assert items.parameters["page_size"] == {"type": "integer"}  # a loose type name normalized
    assert items.required == ["category_id", "x_trace"]
    listed = items.output_schema
    assert listed is not None and listed["items"]["required"] == ["title", "id"]  # allOf merged
    assert set(listed["items"]["properties"]) == {"title", "price", "class", "id"}

    post = tools["get_category_2"]
    assert post.kind == "write" and post.parameters["body"] == {"type": "array", "items": {"type": "string"}}
    assert post.required == ["category_id", "body"]  # the undeclared template variable is added
    assert post.output_schema == {"type": "string"}


def test_swagger_2_is_converted_minimally() -> None:
    doc = {
        "swagger": "2.0",
        "info": {"title": "Pet Store", "description": "Pets for sale."},
        "paths": {
            "/pets/{petId}": {
                "get": {
                    "operationId": "getPet",
                    "parameters": [
                        {"name": "petId", "in": "path", "required": True, "type": "integer", "format": "int64"}
                    ],
                    "responses": {"200": {"description": "ok", "schema": {"$ref": "#/definitions/Pet"}}},
                },
                "post": {
                    "operationId": "updatePet",
                    "consumes": ["application/x-www-form-urlencoded"],
                    "parameters": [
                        {"name": "petId", "in": "path", "required": True, "type": "integer"},
                        {"name": "name", "in": "formData", "type": "string", "required": True},
                        {"name": "photo", "in": "formData", "type": "file"},
                    ],
                    "responses": {"200": {"description": "ok"}},
                },
            },
            "/pets": {
                "post": {
                    "parameters": [
                        {"name": "pet", "in": "body", "required": True, "schema": {"$ref": "#/definitions/Pet"}}
                    ],
                    "responses": {"201": {"description": "created", "schema": {"$ref": "#/definitions/Pet"}}},
                }
            },
        },
        "definitions": {
            "Pet": {
                "type": "object",
                "required": ["name"],
                "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
            }
        },
    }
    tools = _tools(openapi_to_metadata(doc, domain="commerce"))
    assert tools["get_pet"].parameters == {"pet_id": {"type": "integer", "format": "int64"}}
    assert tools["get_pet"].output_schema == doc["definitions"]["Pet"]  # type: ignore[index]
    assert (
        tools["update_pet"].required == ["pet_id", "name"]
        and tools["update_pet"].parameters["photo"]["type"] == "string"
    )
    assert tools["post_pets"].required == ["name"] and tools["post_pets"].kind == "write"


def test_names_are_python_identifiers() -> None:
    assert snake_case("getPetById") == "get_pet_by_id"
    assert snake_case("HTTPStatus.check") == "http_status_check"
    assert snake_case("list-pets") == "list_pets"
    assert identifier("2fa code") == "param_2fa_code" and identifier("from") == "from_"


# ---- errors name the file and the JSON path ---------------------------------------------------------


def _write(tmp_path: Path, name: str, doc: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _broken(change: Any) -> dict[str, Any]:
    doc = copy.deepcopy(INLINE)
    change(doc)
    return doc


@pytest.mark.parametrize(
    ("change", "where", "problem"),
    [
        (
            lambda d: d["components"]["schemas"]["Category"]["properties"].update(
                owner={"$ref": "#/components/schemas/User"}
            ),
            "components.schemas.Category.properties.owner.$ref",
            "'#/components/schemas/User' does not resolve",
        ),
        (
            lambda d: d["components"]["schemas"]["NewItem"]["properties"]["price"].update(type="money"),
            "components.schemas.NewItem.properties.price.type",
            "unknown type 'money'",
        ),
        (
            lambda d: d["paths"]["/categories/{categoryId}"]["get"].update(
                responses={"200": {"content": {"application/json": {"schema": {"$ref": "other.yaml#/Pet"}}}}}
            ),
            'paths["/categories/{categoryId}"].get.responses["200"].content["application/json"].schema.$ref',
            "external reference",
        ),
        (
            lambda d: d["paths"]["/categories/{categoryId}/items"]["get"]["parameters"].append({"in": "query"}),
            'paths["/categories/{categoryId}/items"].get.parameters[4]',
            "needs a string 'name' and 'in'",
        ),
        (lambda d: d.update(openapi="4.0.0"), "openapi", "unsupported OpenAPI version '4.0.0'"),
        (lambda d: d.pop("openapi"), "<root>", "not an OpenAPI document"),
        (lambda d: d.update(paths={}), "paths", "defines no operations"),
        (lambda d: d.pop("paths"), "paths", "missing"),
    ],
)
def test_invalid_documents_name_the_file_and_path(tmp_path: Path, change: Any, where: str, problem: str) -> None:
    path = _write(tmp_path, "broken.json", _broken(change))
    with pytest.raises(OpenAPIError) as err:
        openapi_to_metadata(path, domain="commerce")
    assert isinstance(err.value, MetadataError)
    assert err.value.source == str(path) and err.value.field == where
    assert problem in err.value.problem and str(path) in str(err.value)


def test_unreadable_files_are_clear_errors(tmp_path: Path) -> None:
    bad = tmp_path / "api.yaml"
    bad.write_text("openapi: 3.0.0\npaths: [unclosed\n")
    with pytest.raises(OpenAPIError, match=r"api\.yaml: field '<file>': not valid YAML"):
        openapi_to_metadata(bad, domain="office")
    with pytest.raises(OpenAPIError, match="cannot read"):
        openapi_to_metadata(tmp_path / "missing.json", domain="office")
    untitled = _write(tmp_path, "untitled.json", {**INLINE, "info": {"version": "1"}})
    with pytest.raises(OpenAPIError, match=r"info\.title"):
        openapi_to_metadata(untitled, domain="office")
    assert openapi_to_metadata(untitled, name="store", description="A store.", domain="office").name == "store"


def test_metadata_validation_errors_name_the_file(tmp_path: Path) -> None:
    # a converted document still goes through EnvMetadata: a bad domain is reported like any metadata error
    path = _write(tmp_path, "ok.json", INLINE)
    with pytest.raises(MetadataError, match=r"ok\.json: field 'domain'"):
        openapi_to_metadata(path, domain="gardening")  # type: ignore[arg-type]
