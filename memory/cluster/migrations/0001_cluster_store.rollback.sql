DROP TABLE documents;
DROP SEQUENCE documents_seq;
DROP TABLE runs;
DROP TABLE events;
