"""Code intelligence (docs/code.md): the index behind the code_symbols, code_definition,
code_references and code_impact tools (core/tools/code.py), which tree-sitter builds and
stat stamps keep current, stored under the data dir (memory/code_index_store.py).
"""
