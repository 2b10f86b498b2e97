DROP TABLE ids;
DROP TABLE questions;
