// data.h: the data side of neox.c — document readers (jsonl, jsonl.zst, jsonl.gz, txt, directories,
// stdin), the Megatron MMIDIDX indexed dataset (.bin/.idx, read by mmap and written atomically), the
// parallel tokenize-and-write pipeline behind neox-preprocess, numpy's legacy RandomState (MT19937)
// shuffle, GPT-NeoX's sample index (doc_idx / sample_idx / shuffle_idx, cached as .npy files with
// GPT-NeoX's names), train/valid/test splits, dataset blending and the per-rank batch iterator.
// Everything reproduces GPT-NeoX's megatron/data/ so datasets, caches and sample order are the same.
#ifndef NEOX_DATA_H
#define NEOX_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "tokenizer.h"

// =============================================================================================
// Indexed dataset (Megatron MMIDIDX; layout in docs/data.md).
enum {
    NEOX_DTYPE_U8 = 1, NEOX_DTYPE_I8 = 2, NEOX_DTYPE_I16 = 3, NEOX_DTYPE_I32 = 4,
    NEOX_DTYPE_I64 = 5, NEOX_DTYPE_F32 = 6, NEOX_DTYPE_F64 = 7, NEOX_DTYPE_U16 = 8,
};
size_t neox_index_dtype_size(int dtype);           // 0 for an unknown code
const char *neox_index_dtype_name(int dtype);      // "uint16", ...; "unknown" otherwise
// The token type preprocess_data.py picks: uint16 below 65500 ids, else int32.
int neox_dtype_for_vocab(int64_t vocab_size);

typedef struct neox_indexed_dataset {
    char *bin_path, *idx_path;
    int dtype;                 // NEOX_DTYPE_*; only integer types are readable as tokens, any as values
    size_t elem_size;
    int64_t num_items;         // sizes[] / pointers[] entries
    int64_t num_doc_idx;       // doc_idx[] entries (documents + 1)
    int32_t *sizes;            // tokens per item (copied out of the unaligned .idx)
    int64_t *pointers;         // byte offset of each item in .bin
    int64_t *doc_idx;          // item index where each document starts; last = num_items
    int64_t total_tokens;
    const uint8_t *bin;        // the mmap'ed .bin
    size_t bin_size;
} neox_indexed_dataset;

// Opens PREFIX.idx and PREFIX.bin and checks that they agree (sizes, pointers, doc_idx, .bin size);
// a malformed file is an error naming it and what is wrong.
neox_indexed_dataset *neox_indexed_open(const char *prefix, neox_error *err);
void neox_indexed_close(neox_indexed_dataset *ds);
// Copies `length` tokens of item `item` starting at token `offset` into out as int32 (length < 0:
// to the end of the item). Returns the number copied or -1 (range error).
int64_t neox_indexed_get(const neox_indexed_dataset *ds, int64_t item, int64_t offset, int64_t length, int32_t *out,
                         neox_error *err);
// The same for values of any dtype (floats as stored, integers exactly): reward datasets.
int64_t neox_indexed_get_values(const neox_indexed_dataset *ds, int64_t item, int64_t offset, int64_t length,
                                double *out, neox_error *err);

// Writer: PREFIX.bin/.idx are written under temporary names and renamed only by commit.
typedef struct neox_indexed_writer neox_indexed_writer;
neox_indexed_writer *neox_indexed_writer_open(const char *prefix, int dtype, neox_error *err);
// Appends one item (ids must fit the dtype; an id that does not is an error; not for float dtypes).
int neox_indexed_writer_add_item(neox_indexed_writer *w, const int32_t *ids, size_t n, neox_error *err);
// Appends one item of values: for float dtypes (float32 rounds to nearest), or integers that fit.
int neox_indexed_writer_add_values(neox_indexed_writer *w, const double *values, size_t n, neox_error *err);
// Closes the current document (as MMapIndexedDatasetBuilder.end_document).
void neox_indexed_writer_end_document(neox_indexed_writer *w);
// Appends every item and document of ds (same dtype), keeping its document boundaries.
int neox_indexed_writer_append(neox_indexed_writer *w, const neox_indexed_dataset *ds, neox_error *err);
int64_t neox_indexed_writer_items(const neox_indexed_writer *w);
int64_t neox_indexed_writer_tokens(const neox_indexed_writer *w);
int neox_indexed_writer_commit(neox_indexed_writer *w, neox_error *err);  // frees w
void neox_indexed_writer_abort(neox_indexed_writer *w);                     // frees w

// =============================================================================================
// Document readers. Inputs are files or directories (walked recursively in sorted order) or "-"
// for stdin (jsonl, optionally zstd or gzip compressed). Compression is recognised by its magic
// bytes; the format by the name: *.txt is one document per file, everything else is jsonl.
// Reading only splits records; parsing JSON is done by neox_record_text (in worker threads).
typedef struct neox_record {
    const char *data;   // the raw line (jsonl) or whole file (txt); not NUL-terminated
    size_t size;
    const char *file;   // input path, owned by the reader (valid until it is closed)
    int64_t line;       // 1-based line number (1 for txt)
    int is_json;
} neox_record;

typedef struct neox_doc_reader neox_doc_reader;
// Expands inputs (directories into their files); unreadable or missing paths are errors.
neox_doc_reader *neox_doc_reader_open(const char *const *inputs, int ninputs, neox_error *err);
// Reads up to max_records records or about max_bytes bytes, whichever comes first, into recs,
// all from one file; their data stays valid until the next call. Returns the count, 0 at the end,
// -1 on error (a truncated or corrupt compressed file, a read error: the message names the file).
int neox_doc_reader_next(neox_doc_reader *r, neox_record *recs, int max_records, size_t max_bytes, neox_error *err);
// The longest record (a jsonl line, a whole .txt file) the reader holds, decoded: a longer one is an
// error naming the file and line, not an allocation of its size (a small compressed file can
// decode to gigabytes). NEOX_MAX_DOCUMENT_BYTES unless set (neox-preprocess --max-document-bytes).
#define NEOX_MAX_DOCUMENT_BYTES ((size_t)256 << 20)
void neox_doc_reader_set_max_record(neox_doc_reader *r, size_t max_record_bytes);
int64_t neox_doc_reader_bytes_read(const neox_doc_reader *r);   // input bytes consumed (compressed)
int64_t neox_doc_reader_total_bytes(const neox_doc_reader *r);  // sum of file sizes; 0 when unknown
int neox_doc_reader_file_count(const neox_doc_reader *r);
const char *neox_doc_reader_file(const neox_doc_reader *r, int i);
void neox_doc_reader_close(neox_doc_reader *r);

// The text of field `key` of a record (txt records are their own text). A list of strings is
// joined with "\n\n" as lm_dataformat does. Returns a malloc'ed buffer (*size its length), or NULL
// with an error naming file:line[:column] (malformed JSON, missing key, value not text).
char *neox_record_text(const neox_record *rec, const char *key, size_t *size, neox_error *err);

// =============================================================================================
// The preprocess pipeline: records -> text per key -> ids -> one indexed dataset per key, in input
// order for any number of worker threads, with bounded memory.
typedef int64_t (*neox_encode_fn)(void *ctx, const char *text, size_t size, int32_t **ids, size_t *len, size_t *cap,
                                  neox_error *err);

// Cutting one large document for several workers (neox_tokenizer_cuts / neox_tokenizer_encode_piece).
typedef size_t (*neox_cut_fn)(void *ctx, const char *text, size_t size, size_t piece_bytes, size_t *cuts,
                              size_t max_cuts);
typedef int64_t (*neox_encode_piece_fn)(void *ctx, const char *text, size_t size, int starts, int ends, int32_t **ids,
                                        size_t *len, size_t *cap, neox_error *err);

typedef struct neox_preprocess_options {
    const char *const *inputs; int ninputs;
    const char *const *keys; int nkeys;        // jsonl fields; each gets its own dataset
    const char *output_prefix;                 // writes {prefix}_{key}_document.bin/.idx
    neox_encode_fn encode; void *encode_ctx;   // thread-safe
    // Optional (NULL: each document is encoded whole by one worker): a document of at least 256 KiB
    // is cut into pieces of about piece_bytes (0: 16 KiB) that idle workers encode too.
    neox_cut_fn cut; neox_encode_piece_fn encode_piece; size_t piece_bytes;
    int64_t vocab_size;                        // picks the token dtype
    int32_t eod_id; int append_eod;
    int workers;                               // tokenizing threads (>= 1)
    int skip_invalid;                          // skip and count malformed records instead of failing
    int64_t num_docs;                          // expected documents for the ETA (0: use input bytes)
    int64_t log_interval;                      // documents between progress updates
    size_t max_document_bytes;                 // longest record read (0: NEOX_MAX_DOCUMENT_BYTES)
    // preprocess_data_with_mask.py's --mask-before-token (one key only): also writes the label dataset
    // {prefix}_label_document, each document's ids with those up to and including the first occurrence
    // of this pattern masked (-100); both datasets are int32, as that script writes them.
    const int32_t *mask_before; int mask_before_len;
} neox_preprocess_options;

typedef struct neox_preprocess_stats {
    int64_t documents;       // written (per key, counted once per record)
    int64_t tokens;          // over all keys
    int64_t skipped_empty;   // records whose text was empty (for any key)
    int64_t skipped_invalid; // with skip_invalid
    int64_t text_bytes;      // text tokenized
    int64_t input_bytes;     // input consumed (compressed size)
    double seconds;
} neox_preprocess_stats;

int neox_preprocess_run(const neox_preprocess_options *opts, neox_preprocess_stats *stats, neox_error *err);

// =============================================================================================
// Chat-formatted datasets (neox-preprocess chat), as GPT-NeoX's
// tools/datasets/preprocess_data_with_chat_template.py writes them: each jsonl key holds a list of
// {"role", "content"} messages, rendered with the tokenizer's chat template and tokenized into
// {prefix}_{key}_document and the label dataset {prefix}_{key}_label_document beside it (int32,
// the token ids where the loss is taken and -100 where it is masked; docs/post-training.md).
#define NEOX_LABEL_MASKED (-100)

typedef struct neox_chat_preprocess_options {
    const char *const *inputs; int ninputs;
    const char *const *keys; int nkeys;
    const char *output_prefix;
    const neox_tokenizer *tok;
    const neox_chat_format *format;
    const char *generation_role;   // the role whose turns are learned ("assistant")
    int only_last;                 // learn only the last turn
    int no_mask;                   // learn every token (the label dataset repeats the tokens)
    int for_rm;                    // mask everything but a final end-of-sequence token (reward models)
    // --reward-key: also {prefix}_{key}_reward_document, one item per conversation holding the record's
    // reward (int32 when every reward is an integer, as GPT-NeoX writes it; float32 otherwise);
    // binary_reward: the value's truth, as 1 or -1.
    const char *reward_key;
    int binary_reward;
    size_t max_document_bytes;     // longest record read (0: NEOX_MAX_DOCUMENT_BYTES)
} neox_chat_preprocess_options;

// One conversation's tokens and labels (growable arrays, *n entries each). Errors name no file: the
// caller adds where the conversation came from.
int neox_chat_encode(const neox_chat_preprocess_options *o, const struct json_t *messages, int32_t **tokens,
                     int32_t **labels, size_t *n, neox_error *err);
int neox_chat_preprocess_run(const neox_chat_preprocess_options *o, neox_preprocess_stats *stats, neox_error *err);

// =============================================================================================
// numpy's legacy RandomState(seed): MT19937 seeded by init_genrand, and shuffle/permutation as
// numpy implements them (Fisher-Yates from the end with masked rejection sampling on 32-bit draws,
// or 64-bit draws when the bound exceeds 32 bits).
typedef neox_mt19937 neox_random_state;

void neox_random_seed(neox_random_state *rs, uint32_t seed);
uint32_t neox_random_uint32(neox_random_state *rs);
uint64_t neox_random_uint64(neox_random_state *rs);
uint64_t neox_random_interval(neox_random_state *rs, uint64_t max);  // uniform in [0, max]
// Shuffles n elements of elem_size bytes (1, 2, 4 or 8) in place, as RandomState.shuffle.
void neox_random_shuffle(neox_random_state *rs, void *data, int64_t n, size_t elem_size);

// =============================================================================================
// .npy files (format 1.0, C order, little-endian, 1-D or 2-D), written as numpy.save writes them.
typedef struct neox_npy {
    char descr[8];       // "<i4", "<u4", "<i8"
    int ndim;
    int64_t shape[2];
    int64_t count;       // elements
    void *data;          // count * element size bytes (free())
} neox_npy;

int neox_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape, const void *data,
                   neox_error *err);
int neox_npy_read(const char *path, neox_npy *out, neox_error *err);
// The data of a read array as int64 (converts <i4/<u4/<i8); a new buffer (free()).
int64_t *neox_npy_to_i64(const neox_npy *a);

// =============================================================================================
// GPT-NeoX's sample index (GPT2Dataset._build_index_mappings).
typedef enum { NEOX_PACK_PACKED, NEOX_PACK_UNTIL_OVERFLOW, NEOX_PACK_UNPACKED } neox_pack_impl;
int neox_pack_impl_parse(const char *name, neox_pack_impl *out);
const char *neox_pack_impl_name(neox_pack_impl p);  // "packed", "pack_until_overflow", "unpacked"

typedef struct neox_sample_index_options {
    const char *name;          // "train", "valid", "test", "train_0", ...: part of the cache name
    const char *data_prefix;   // for the cache names; NULL: no cache
    const char *cache_dir;     // where the caches are (data_cache_dir); NULL: beside the data
    int64_t doc_begin, doc_end;  // documents [begin, end) of the dataset
    int64_t num_samples;
    int seq_length;
    uint32_t seed;
    neox_pack_impl pack_impl;
    int allow_chopped;
    // pack_until_overflow and unpacked skip documents whose first labels are all masked (-100) in
    // this label dataset, as GPT-NeoX does; NULL: no label dataset.
    const neox_indexed_dataset *labels;
} neox_sample_index_options;

typedef struct neox_sample_index {
    int num_epochs;
    int64_t doc_idx_len;
    int64_t *doc_idx;          // documents in sample order
    int64_t sample_idx_len;    // rows (samples + 1)
    int64_t *sample_idx;       // [row][2]: index into doc_idx, token offset
    int64_t shuffle_idx_len;
    int64_t *shuffle_idx;
    int64_t length;            // len(GPT2Dataset) = min(shuffle_idx_len - 1, sample_idx_len - 1)
} neox_sample_index;

// Builds (or loads the cached) index. With data_prefix set, the three .npy caches are read when
// present and otherwise built and written atomically under an advisory lock, so concurrent
// builders never corrupt or half-read them. *loaded tells which happened (may be NULL).
neox_sample_index *neox_sample_index_build(const neox_indexed_dataset *ds, const neox_sample_index_options *opts,
                                           int *loaded, neox_error *err);
void neox_sample_index_free(neox_sample_index *si);
// Whether the first n labels of item doc are all NEOX_LABEL_MASKED (scratch holds n ids).
int neox_labels_all_masked(const neox_indexed_dataset *labels, int64_t doc, int64_t n, int32_t *scratch, int *masked,
                           neox_error *err);
// The index of a pairwise dataset (pairwise_index.c), from the chosen and rejected datasets (one
// document each per pair) and their label datasets (both or neither), built in memory.
neox_sample_index *neox_pairwise_index_build(const neox_indexed_dataset *pos, const neox_indexed_dataset *neg,
                                             const neox_indexed_dataset *pos_labels,
                                             const neox_indexed_dataset *neg_labels,
                                             const neox_sample_index_options *o, neox_error *err);
// The cache path prefix GPT-NeoX uses: {prefix}_{name}_indexmap_{ns}ns_{sl}sl_{seed}s_{pi}pi[_ac]
// (with cache_dir set, the same name under that directory: {cache_dir}/{basename(prefix)}_...).
char *neox_sample_index_cache_name(const neox_sample_index_options *opts);

// The dataset a cache was built from (lib/data/cache_identity.c): {cache}_identity.json beside the
// .npy files records the .idx's size and CRC-32, the .bin's size and the item, document and token
// counts; a cache whose record differs from the dataset now is rebuilt, or refused where it cannot be.
typedef enum { NEOX_CACHE_IDENTITY_ABSENT, NEOX_CACHE_IDENTITY_MATCHES, NEOX_CACHE_IDENTITY_DIFFERS } neox_cache_identity;
int neox_cache_identity_check(const char *base, const neox_indexed_dataset *ds, neox_cache_identity *result,
                              neox_error *err);
int neox_cache_identity_write(const char *base, const neox_indexed_dataset *ds, neox_error *err);
int neox_num_epochs(int64_t tokens_per_epoch, int seq_length, int64_t num_samples);

// =============================================================================================
// Splits, weights, blending (data_utils.py, blendable_dataset.py).
// "949,50,1" (or '/'-separated) -> document boundaries index[4] over num_docs documents.
int neox_split_ranges(const char *splits, int64_t num_docs, int64_t index[4], neox_error *err);
// Normalises weights and gives ceil(num_samples * w * 1.005) samples per dataset.
void neox_normalized_weights(const double *weights, int n, int64_t num_samples, double *out_weights,
                             int64_t *out_samples);
// weights_by_num_docs: p ~ (n_i/N)^alpha, times (1 - n_i/N), normalised.
void neox_weights_by_num_docs(const int64_t *num_docs, int n, double alpha, double *out_weights);
// build_blending_indices: greedy assignment of `size` samples to datasets by largest error.
void neox_blending_indices(const double *weights, int n, int64_t size, uint8_t *dataset_index,
                           int64_t *dataset_sample_index);
// [train, valid, test] sample counts from train_iters, eval_interval, eval_iters, train_batch_size.
void neox_train_valid_test_samples(int64_t train_iters, int64_t eval_interval, int64_t eval_iters,
                                   int64_t train_batch_size, int64_t out[3]);

// =============================================================================================
// Datasets as the trainer sees them: one GPT2Dataset, or a BlendableDataset over several.
typedef struct neox_gpt2_dataset {
    neox_indexed_dataset *data;   // owned; the chosen (pos_*) side of a pairwise dataset
    neox_indexed_dataset *labels; // owned; NULL without a label dataset (its items match data's)
    neox_indexed_dataset *neg;    // owned; a pairwise dataset's rejected side (neg_*), else NULL
    neox_indexed_dataset *neg_labels;  // owned; its labels, present exactly when labels is
    neox_indexed_dataset *rewards;     // owned; NULL without a reward dataset (KTO): item i is document
                                       // i's reward, of which the first value is used, as GPT-NeoX does
    neox_sample_index *index;     // owned
    int seq_length;
} neox_gpt2_dataset;

typedef struct neox_dataset {
    int count;                    // component datasets
    neox_gpt2_dataset *parts;
    double *weights;              // normalised; NULL when not blended
    int64_t size;                 // samples
    uint8_t *dataset_index;       // NULL when not blended (count == 1 and a plain GPT2Dataset)
    int64_t *dataset_sample_index;
    int seq_length;
    int has_labels;               // every part has a label dataset (*_label_data_paths)
    int pairwise;                 // dataset_impl pairwise: every sample is a (chosen, rejected) pair
    int has_rewards;              // every part has a reward dataset (*_reward_data_paths)
    int64_t vocab_size;           // set by the user of the samples: ids must lie below it (0: unchecked)
} neox_dataset;

// Fills tokens[seq_length + 1] with sample idx (idx wraps modulo the size, as GPT-NeoX's
// IndexError fallback does); a short sample is padded with -100. With labels non-NULL and a label
// dataset, labels[seq_length + 1] gets the same span of it (also padded with -100). With
// vocab_size set, a token or label id outside the vocabulary is an error naming the dataset and
// the sample.
int neox_dataset_sample(const neox_dataset *d, int64_t idx, int32_t *tokens, int32_t *labels, neox_error *err);
// A pairwise dataset's sample idx: the chosen side into pos (and pos_labels), the rejected side into
// neg (and neg_labels), each seq_length + 1 ids as GPT-NeoX's PairwiseDataset gives them: tokens
// padded with 0, labels with -100 (so without label datasets the padding is scored, as there).
int neox_dataset_pair_sample(const neox_dataset *d, int64_t idx, int32_t *pos, int32_t *pos_labels, int32_t *neg,
                             int32_t *neg_labels, neox_error *err);
// The reward row of sample idx (which must have a reward dataset), as GPT2Dataset gives it: over
// each document's span of the sample that document's reward, padding 0; out[seq_length + 1].
int neox_dataset_sample_rewards(const neox_dataset *d, int64_t idx, float *out, neox_error *err);
// Rows of a micro-batch per sample: 2 for a pairwise dataset (chosen rows, then rejected rows), else 1.
static inline int neox_dataset_rows_per_sample(const neox_dataset *d) { return d && d->pairwise ? 2 : 1; }
void neox_dataset_free(neox_dataset *d);

// The data settings of a GPT-NeoX config, as plain values.
typedef struct neox_data_settings {
    const char *data_path;                 // with split
    const char *split;
    const char *const *train_paths; int ntrain;  // or these with their weights
    const char *const *valid_paths; int nvalid;
    const char *const *test_paths; int ntest;
    const char *const *train_label_paths, *const *valid_label_paths, *const *test_label_paths;  // NULL or
                                           // one per data path (*_label_data_paths)
    const char *const *train_reward_paths, *const *valid_reward_paths, *const *test_reward_paths;  // NULL or
                                           // one per data path (*_reward_data_paths; pack_impl unpacked)
    // dataset_impl pairwise: the train/valid/test paths above are the chosen side (pos_*), these the
    // rejected side (neg_*), one per chosen path; their labels likewise.
    int pairwise;
    const char *const *train_neg_paths, *const *valid_neg_paths, *const *test_neg_paths;
    const char *const *train_neg_label_paths, *const *valid_neg_label_paths, *const *test_neg_label_paths;
    const double *train_weights, *valid_weights, *test_weights;  // NULL: all 1
    int weight_by_num_documents;
    double weighted_sampler_alpha;
    int seq_length;
    uint32_t seed;
    int64_t train_iters, eval_interval, eval_iters, train_batch_size;
    neox_pack_impl pack_impl;
    int allow_chopped;
    int use_cache;                          // write/read the .npy index caches
    const char *cache_dir;                  // data_cache_dir: where (NULL: next to the data)
} neox_data_settings;

// Fills s from a loaded config (lib/config.h); the path and weight lists point into the config
// and are freed by neox_data_settings_release (the config must outlive s).
typedef struct neox_config neox_config;
int neox_data_settings_from_config(const neox_config *cfg, neox_data_settings *s, neox_error *err);
void neox_data_settings_release(neox_data_settings *s);

// The lengths of the lists that go one per data path, per split (train, valid, test); which lists
// were given is s's pointers. Whoever fills a neox_data_settings other than from a config (neox-preprocess
// index) fills these too.
typedef struct neox_data_list_lengths {
    int weights[3], labels[3], rewards[3], neg[3], neg_labels[3];
} neox_data_list_lengths;
// The rules that tie the data settings' lists together, the one check every reader of data settings
// runs (neox_data_settings_from_config runs it): each weight, label, reward and rejected-data list
// has one entry per data path; rejected data and its labels only with pairwise data, both label
// lists or neither there, and a training set; rewards only with plain data and pack_impl unpacked.
// Errors name the GPT-NeoX keys.
int neox_data_settings_check(const neox_data_settings *s, const neox_data_list_lengths *n, neox_error *err);

// Builds train/valid/test datasets as build_train_valid_test_data_iterators does; a dataset that
// has no documents or no samples is NULL. Returns -1 on error.
int neox_build_datasets(const neox_data_settings *s, neox_dataset *out[3], neox_error *err);

// =============================================================================================
// Batch iterator: each step takes the next global batch of micro_batch * dp samples in order and
// gives rank r the contiguous slice [r * micro_batch, (r + 1) * micro_batch), as GPT-NeoX's
// DistributedBatchSampler. The position (micro-batches consumed) is saved and restored exactly.
typedef struct neox_batch_iterator {
    const neox_dataset *dataset;
    int micro_batch, dp_size, dp_rank;
    int64_t position;          // global batches consumed (GPT-NeoX: iteration * grad_accum)
    int32_t eod_id;
    int eod_mask_loss;
} neox_batch_iterator;

typedef struct neox_batch {
    int micro_batch, seq_length;   // micro_batch rows: a pairwise dataset's chosen rows, then its rejected ones
    int32_t *tokens;    // [micro_batch][seq_length] inputs (padding replaced by 0)
    int32_t *labels;    // [micro_batch][seq_length] next tokens, or with a label dataset its next labels
                        // (padding and masked labels replaced by 0)
    float *loss_mask;   // [micro_batch][seq_length] 0 for padding, masked labels (< 0) and, with
                        // eod_mask_loss, EOD inputs
    float *rewards;     // [micro_batch][seq_length] with a reward dataset the reward of each input
                        // position (GPT-NeoX's reward[:, :-1]), else 0
} neox_batch;

void neox_batch_iterator_init(neox_batch_iterator *it, const neox_dataset *d, int micro_batch, int dp_size,
                              int dp_rank, int32_t eod_id, int eod_mask_loss);
int64_t neox_batch_iterator_batches(const neox_batch_iterator *it);  // len(dataloader) (drop_last)
// A batch of micro_batch rows (micro_batch samples times neox_dataset_rows_per_sample).
neox_batch *neox_batch_alloc(int micro_batch, int seq_length);
void neox_batch_free(neox_batch *b);
int neox_batch_next(neox_batch_iterator *it, neox_batch *b, neox_error *err);
// num_workers >= 1: the batch after each one read on a background thread (prefetch.c). *b becomes
// the batch at it's position (swapped with the prefetched buffer when that is the one, read now
// otherwise: the same batches and errors as neox_batch_next), it advances, and the read of the
// next position starts. Batches must all be micro_batch x seq_length. NULL, with a warning, when the
// thread cannot be started: the caller then reads with neox_batch_next (the same batches, unhidden).
typedef struct neox_prefetch neox_prefetch;
neox_prefetch *neox_prefetch_start(int micro_batch, int seq_length);
int neox_prefetch_next(neox_prefetch *p, neox_batch_iterator *it, neox_batch **b, neox_error *err);
void neox_prefetch_free(neox_prefetch *p);
// Saving and restoring is the position; resume with position = iteration * gradient_accumulation_steps.
static inline int64_t neox_batch_iterator_position(const neox_batch_iterator *it) { return it->position; }
static inline void neox_batch_iterator_seek(neox_batch_iterator *it, int64_t position) { it->position = position; }

#endif
