"""Which files are code, in which language, and the grammar and queries to read them.

Why a table: a file's extension decides its language once, here; everything else (the
index, import resolution, the tools) asks by language name. The grammars are the
installed `tree_sitter_<language>` wheels, loaded on first use only: `steward run`
imports this module at start (the tools are registered then), and tree-sitter with six
grammars is memory a chat that never asks about code should not pay for.

The queries name what they capture: `@def.<kind>` (a definition, its `@name`),
`@ref.<kind>` (a use of `@name`: a call, a type, a base class), `@import` (an import of
the module `@spec`, naming `@name` when it imports one), `@container` (an `impl`
block: not a symbol, but the type its functions are methods of).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tree_sitter import Language, Query

#: Extension -> language name.
EXTENSIONS: dict[str, str] = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".mts": "typescript",
    ".cts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
}

#: Languages whose files can use each other's definitions (TypeScript imports JavaScript).
FAMILY: dict[str, str] = {
    "python": "python",
    "javascript": "js",
    "typescript": "js",
    "tsx": "js",
    "go": "go",
    "rust": "rust",
    "java": "java",
}

#: Kinds of definition that hold methods: a function defined directly inside one is a method.
CLASS_LIKE = frozenset({"class", "interface", "struct", "enum", "trait", "impl"})

#: Names never worth a reference row: built-in types that no workspace defines.
BUILTIN_TYPES: dict[str, frozenset[str]] = {
    "go": frozenset(
        "any bool byte complex64 complex128 error float32 float64 int int8 int16 int32 "
        "int64 rune string uint uint8 uint16 uint32 uint64 uintptr comparable".split()
    ),
    "java": frozenset("String Object Integer Long Double Boolean Void".split()),
    "js": frozenset("string number boolean any unknown void never object".split()),
    "python": frozenset("int float str bool bytes list dict set tuple object type".split()),
}


def language_of(name: str) -> str | None:
    """The language of a file name, by its extension (None: not code the index reads)."""
    dot = name.rfind(".")
    return EXTENSIONS.get(name[dot:].lower()) if dot > 0 else None


_PYTHON = """
(class_definition name: (identifier) @name) @def.class
(function_definition name: (identifier) @name) @def.function
(call function: (identifier) @name) @ref.call
(call function: (attribute attribute: (identifier) @name)) @ref.call
(class_definition superclasses: (argument_list (identifier) @name)) @ref.inherit
(class_definition superclasses: (argument_list (attribute attribute: (identifier) @name)))
  @ref.inherit
(decorator (identifier) @name) @ref.use
(decorator (attribute attribute: (identifier) @name)) @ref.use
(type (identifier) @name) @ref.type
(import_statement name: (dotted_name) @spec) @import
(import_statement name: (aliased_import name: (dotted_name) @spec)) @import
(import_from_statement module_name: (_) @spec name: (dotted_name) @name) @import
(import_from_statement module_name: (_) @spec name: (aliased_import name: (dotted_name) @name))
  @import
(import_from_statement module_name: (_) @spec (wildcard_import)) @import
"""

#: What JavaScript, TypeScript and TSX share.
_JS_COMMON = """
(function_declaration name: (identifier) @name) @def.function
(generator_function_declaration name: (identifier) @name) @def.function
(method_definition name: [(property_identifier) (private_property_identifier)] @name)
  @def.method
(variable_declarator name: (identifier) @name value: [(arrow_function) (function_expression)])
  @def.function
(call_expression function: (identifier) @name) @ref.call
(call_expression function: (member_expression property: (property_identifier) @name)) @ref.call
(new_expression constructor: (identifier) @name) @ref.call
(new_expression constructor: (member_expression property: (property_identifier) @name))
  @ref.call
(import_statement (import_clause (named_imports (import_specifier name: (identifier) @name)))
  source: (string (string_fragment) @spec)) @import
(import_statement (import_clause (identifier) @name) source: (string (string_fragment) @spec))
  @import
(import_statement (import_clause (namespace_import (identifier) @name))
  source: (string (string_fragment) @spec)) @import
(import_statement source: (string (string_fragment) @spec)) @import
(export_statement source: (string (string_fragment) @spec)) @import
((call_expression function: (identifier) @_require
  arguments: (arguments . (string (string_fragment) @spec)))
  (#eq? @_require "require")) @import
"""

_JAVASCRIPT = (
    _JS_COMMON
    + """
(class_declaration name: (identifier) @name) @def.class
(class_heritage (identifier) @name) @ref.inherit
(class_heritage (member_expression property: (property_identifier) @name)) @ref.inherit
"""
)

_TYPESCRIPT = (
    _JS_COMMON
    + """
(class_declaration name: (type_identifier) @name) @def.class
(abstract_class_declaration name: (type_identifier) @name) @def.class
(interface_declaration name: (type_identifier) @name) @def.interface
(type_alias_declaration name: (type_identifier) @name) @def.type
(enum_declaration name: (identifier) @name) @def.enum
(method_signature name: (property_identifier) @name) @def.method
(abstract_method_signature name: (property_identifier) @name) @def.method
(function_signature name: (identifier) @name) @def.function
(extends_clause value: (identifier) @name) @ref.inherit
(implements_clause (type_identifier) @name) @ref.inherit
(extends_type_clause type: (type_identifier) @name) @ref.inherit
(type_identifier) @name @ref.type
"""
)

_GO = """
(function_declaration name: (identifier) @name) @def.function
(method_declaration
  receiver: (parameter_list (parameter_declaration
    type: [(type_identifier) @receiver (pointer_type (type_identifier) @receiver)
           (generic_type type: (type_identifier) @receiver)
           (pointer_type (generic_type type: (type_identifier) @receiver))]))
  name: (field_identifier) @name) @def.method
(type_spec name: (type_identifier) @name type: (struct_type)) @def.struct
(type_spec name: (type_identifier) @name type: (interface_type)) @def.interface
(type_spec name: (type_identifier) @name) @def.type
(method_elem name: (field_identifier) @name) @def.method
(call_expression function: (identifier) @name) @ref.call
(call_expression function: (selector_expression field: (field_identifier) @name)) @ref.call
(composite_literal type: (type_identifier) @name) @ref.call
(composite_literal type: (qualified_type name: (type_identifier) @name)) @ref.call
(type_identifier) @name @ref.type
(import_spec path: (interpreted_string_literal) @spec) @import
"""

_RUST = """
(function_item name: (identifier) @name) @def.function
(function_signature_item name: (identifier) @name) @def.function
(struct_item name: (type_identifier) @name) @def.struct
(enum_item name: (type_identifier) @name) @def.enum
(union_item name: (type_identifier) @name) @def.struct
(trait_item name: (type_identifier) @name) @def.trait
(type_item name: (type_identifier) @name) @def.type
(mod_item name: (identifier) @name) @def.module
(macro_definition name: (identifier) @name) @def.macro
(impl_item type: [(type_identifier) @name (generic_type type: (type_identifier) @name)])
  @container
(call_expression function: (identifier) @name) @ref.call
(call_expression function: (field_expression field: (field_identifier) @name)) @ref.call
(call_expression function: (scoped_identifier path: (_) @spec name: (identifier) @name))
  @ref.call
(call_expression function: (generic_function function: (identifier) @name)) @ref.call
(macro_invocation macro: (identifier) @name) @ref.call
(token_tree (identifier) @name . (token_tree)) @ref.call
(struct_expression name: (type_identifier) @name) @ref.call
(impl_item trait: (type_identifier) @name) @ref.inherit
(type_identifier) @name @ref.type
(use_declaration argument: (_) @spec) @import
"""

_JAVA = """
(class_declaration name: (identifier) @name) @def.class
(interface_declaration name: (identifier) @name) @def.interface
(enum_declaration name: (identifier) @name) @def.enum
(record_declaration name: (identifier) @name) @def.class
(method_declaration name: (identifier) @name) @def.method
(constructor_declaration name: (identifier) @name) @def.constructor
(method_invocation name: (identifier) @name) @ref.call
(object_creation_expression type: (type_identifier) @name) @ref.call
(superclass (type_identifier) @name) @ref.inherit
(super_interfaces (type_list (type_identifier) @name)) @ref.inherit
(type_identifier) @name @ref.type
(import_declaration (scoped_identifier) @spec) @import
"""

QUERIES: dict[str, str] = {
    "python": _PYTHON,
    "javascript": _JAVASCRIPT,
    "typescript": _TYPESCRIPT,
    "tsx": _TYPESCRIPT,
    "go": _GO,
    "rust": _RUST,
    "java": _JAVA,
}


@dataclass(frozen=True, slots=True)
class Grammar:
    """One language's loaded grammar and compiled query."""

    name: str
    language: Language
    query: Query


_grammars: dict[str, Grammar] = {}
_lock = threading.Lock()


def _load_language(name: str) -> Any:
    """The grammar wheel's language pointer (imported here, on first use)."""
    if name == "python":
        import tree_sitter_python

        return tree_sitter_python.language()
    if name == "javascript":
        import tree_sitter_javascript

        return tree_sitter_javascript.language()
    if name in ("typescript", "tsx"):
        import tree_sitter_typescript

        if name == "tsx":
            return tree_sitter_typescript.language_tsx()
        return tree_sitter_typescript.language_typescript()
    if name == "go":
        import tree_sitter_go

        return tree_sitter_go.language()
    if name == "rust":
        import tree_sitter_rust

        return tree_sitter_rust.language()
    if name == "java":
        import tree_sitter_java

        return tree_sitter_java.language()
    raise KeyError(name)


def grammar(name: str) -> Grammar:
    """The loaded grammar of `name`, loaded and its query compiled once per process.
    Raises `GrammarMissing` when the grammar's wheel is not installed."""
    found = _grammars.get(name)
    if found is not None:
        return found
    with _lock:
        found = _grammars.get(name)
        if found is None:
            try:
                from tree_sitter import Language, Query

                language = Language(_load_language(name))
            except ImportError as exc:
                raise GrammarMissing(
                    f"the {name} grammar is not installed ({exc}); reinstall Steward with "
                    "`python3 dev.py setup`, which installs tree-sitter and its grammars"
                ) from None
            found = Grammar(name, language, Query(language, QUERIES[name]))
            _grammars[name] = found
    return found


class GrammarMissing(RuntimeError):
    """tree-sitter or a grammar wheel is not importable."""
