-- Tables for orders.yaml. They are yours: ratchet writes rows, never DDL.
CREATE TABLE IF NOT EXISTS orders (
  order_id   text PRIMARY KEY,
  customer   text,
  amount     numeric(12, 2),
  updated_at timestamptz
);
CREATE TABLE IF NOT EXISTS revenue_per_minute (
  country  text NOT NULL,
  minute   timestamptz NOT NULL,
  orders   bigint,
  revenue  double precision,
  biggest  double precision,
  smallest double precision,
  PRIMARY KEY (country, minute)
);
