DROP TABLE usage_totals;
DROP SEQUENCE usage_rev;
DROP TABLE usage_calls;
