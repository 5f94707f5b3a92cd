//! TPC-DS's tables at a small scale factor, joined the ways its queries
//! join them: star joins, returns matched to their sales (foreign keys that
//! are often NULL), EXISTS and NOT EXISTS, NOT IN over a column with NULLs,
//! a full outer join of two channels, and EXISTS under OR (a mark join).
//! TPC's own queries are not shipped with the crate; these are written for
//! this test, and each must give DataFusion's rows with its joins on the
//! GPU join, over tables in memory and over Parquet files.

use datafusion::prelude::{SessionConfig, SessionContext};
use gpu_join_workloads::{comparable_rows, tpcds};

use crate::common::{datafusion_context, gpu_context, gpu_joins, run};

const SCALE_FACTOR: f64 = 0.01;

/// Each query, and the join types its plan must run on the GPU join.
const QUERIES: [(&str, &[&str]); 7] = [
    (
        "select d_year, i_brand_id, sum(ss_ext_sales_price) sales, count(*) n
         from store_sales, date_dim, item, store
         where ss_sold_date_sk = d_date_sk and ss_item_sk = i_item_sk and ss_store_sk = s_store_sk
           and d_moy = 11 and s_state = 'TN'
         group by d_year, i_brand_id",
        &["Inner"],
    ),
    (
        // DataFusion builds on the smaller returns: the left join runs as a
        // right join with its sides swapped.
        "select count(*) sales, count(sr_ticket_number) returned, sum(sr_return_amt) amount
         from store_sales left join store_returns
           on ss_ticket_number = sr_ticket_number and ss_item_sk = sr_item_sk",
        &["Right"],
    ),
    (
        "select c_customer_id, c_last_name from customer c
         where exists (select 1 from web_sales where ws_bill_customer_sk = c.c_customer_sk)
           and not exists (select 1 from catalog_sales
                           where cs_ship_customer_sk = c.c_customer_sk and cs_quantity > 98)",
        &["Semi", "Anti"],
    ),
    (
        "select count(*) from customer
         where c_current_addr_sk not in (select ss_addr_sk from store_sales where ss_quantity > 90)",
        &["Anti"],
    ),
    (
        "select count(*) from item
         where i_item_sk not in (select ss_item_sk from store_sales where ss_item_sk is not null)",
        &["Anti"],
    ),
    (
        "with ss as (select ss_customer_sk customer_sk, ss_item_sk item_sk from store_sales group by 1, 2),
              cs as (select cs_bill_customer_sk customer_sk, cs_item_sk item_sk from catalog_sales group by 1, 2)
         select sum(case when ss.customer_sk is not null and cs.customer_sk is null then 1 else 0 end) store_only,
                sum(case when ss.customer_sk is null and cs.customer_sk is not null then 1 else 0 end) catalog_only,
                sum(case when ss.customer_sk is not null and cs.customer_sk is not null then 1 else 0 end) both_
         from ss full outer join cs on ss.customer_sk = cs.customer_sk and ss.item_sk = cs.item_sk",
        &["Full"],
    ),
    (
        "select cd_gender, cd_marital_status, count(*) from customer c, customer_demographics
         where c.c_current_cdemo_sk = cd_demo_sk
           and (exists (select 1 from web_sales where c.c_customer_sk = ws_bill_customer_sk)
                or exists (select 1 from catalog_sales where c.c_customer_sk = cs_ship_customer_sk))
         group by cd_gender, cd_marital_status",
        &["Mark"],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpcds_joins_match_datafusion() {
    let config = SessionConfig::new().with_target_partitions(3).with_batch_size(1000);
    let (gpu, reference) = (gpu_context(config.clone()), datafusion_context(config));
    tpcds::register_tables(&gpu, SCALE_FACTOR, 3).expect("tables");
    tpcds::register_tables(&reference, SCALE_FACTOR, 3).expect("tables");
    joins_match(&gpu, &reference).await;
}

/// The same from Parquet files: listing tables whose statistics come from
/// the footers, so the plans (and the build sides DataFusion picks) differ
/// from those over memory, and whose scans take the joins' dynamic filters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpcds_joins_from_parquet_match_datafusion() {
    let dir = tempfile::tempdir().unwrap();
    let folder = tpcds::write_parquet(dir.path(), SCALE_FACTOR, 3).expect("Parquet files");
    assert!(folder.join("store_sales/part-003.parquet").is_file(), "one file per part");
    let config = SessionConfig::new().with_target_partitions(3).with_batch_size(1000);
    let (gpu, reference) = (gpu_context(config.clone()), datafusion_context(config));
    tpcds::register_parquet(&gpu, &folder).await.expect("tables");
    tpcds::register_parquet(&reference, &folder).await.expect("tables");
    joins_match(&gpu, &reference).await;
}

/// Runs each query in both sessions: the same rows, and the join types the
/// query must run on the GPU join among its GPU joins.
async fn joins_match(gpu: &SessionContext, reference: &SessionContext) {
    for (number, (sql, join_types)) in QUERIES.iter().enumerate() {
        let expected = run(reference, sql).await;
        let actual = run(gpu, sql).await;
        assert!(expected.iter().any(|b| b.num_rows() > 0), "query {number} returned no rows");
        assert_eq!(comparable_rows(&actual).unwrap(), comparable_rows(&expected).unwrap(), "query {number}");
        let plan = gpu.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let on_gpu: Vec<String> = gpu_joins(&plan).iter().map(|join| format!("{:?}", join.join_type())).collect();
        for join_type in *join_types {
            assert!(
                on_gpu.iter().any(|t| t.contains(join_type)),
                "query {number}: no {join_type} join among the GPU joins {on_gpu:?}"
            );
        }
    }
}
