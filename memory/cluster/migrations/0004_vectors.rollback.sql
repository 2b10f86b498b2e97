-- `vector_texts` (made by the code where the server has pgvector) goes with the table; the
-- extension itself stays (other databases of the server may use it).
DROP TABLE IF EXISTS vector_texts;
DROP TABLE vectors;
