// chat_template_ast.h: the parsed form of a chat template, shared by its parser
// (chat_template_parse.c) and its renderer (chat_template_render.c). A template is a list of nodes
// (text, {{ output }}, if, for, set); expressions are trees whose leaves are literals (jansson
// values) and names. Every node and expression keeps its template line for error messages.
#ifndef NEOX_CHAT_TEMPLATE_AST_H
#define NEOX_CHAT_TEMPLATE_AST_H

#include <stddef.h>

#include <jansson.h>

#include "tokenizer.h"

typedef enum {
    CT_EXPR_LITERAL,    // value
    CT_EXPR_NAME,       // name
    CT_EXPR_LIST,       // items[n_items]
    CT_EXPR_SUBSCRIPT,  // a[b]   (a.name is a subscript by the string "name", as Jinja looks it up on dicts)
    CT_EXPR_SLICE,      // a[b:c] (b, c may be NULL)
    CT_EXPR_CALL,       // name(items...): only raise_exception
    CT_EXPR_FILTER,     // a | name
    CT_EXPR_TEST,       // a is [not] name
    CT_EXPR_NOT,        // not a
    CT_EXPR_NEG,        // -a
    CT_EXPR_BINARY,     // a op b
    CT_EXPR_COND,       // a if b else c (c may be NULL)
} ct_expr_kind;

typedef enum {
    CT_OP_OR, CT_OP_AND, CT_OP_EQ, CT_OP_NE, CT_OP_LT, CT_OP_LE, CT_OP_GT, CT_OP_GE, CT_OP_IN, CT_OP_NOT_IN,
    CT_OP_ADD, CT_OP_SUB, CT_OP_CONCAT, CT_OP_MUL, CT_OP_MOD,
} ct_op;

typedef struct ct_expr {
    ct_expr_kind kind;
    int line;
    ct_op op;
    int negated;           // CT_EXPR_TEST: "is not"
    char *name;            // CT_EXPR_NAME, CALL, FILTER, TEST
    json_t *value;         // CT_EXPR_LITERAL
    struct ct_expr *a, *b, *c;
    struct ct_expr **items;
    size_t n_items;
} ct_expr;

typedef enum { CT_NODE_TEXT, CT_NODE_OUTPUT, CT_NODE_IF, CT_NODE_FOR, CT_NODE_SET } ct_node_kind;

typedef struct ct_node ct_node;
typedef struct ct_body {
    ct_node **nodes;
    size_t n;
} ct_body;

struct ct_node {
    ct_node_kind kind;
    int line;
    char *text;            // CT_NODE_TEXT (text_size bytes)
    size_t text_size;
    char *name;            // CT_NODE_FOR loop variable, CT_NODE_SET target
    ct_expr *expr;         // OUTPUT, FOR iterable, SET value
    // CT_NODE_IF: conds[i] guards bodies[i]; a final else has conds[i] == NULL.
    // CT_NODE_FOR: bodies[0] is the loop body, bodies[1] (when n_bodies == 2) its else.
    ct_expr **conds;
    ct_body *bodies;
    size_t n_bodies;
};

struct neox_chat_template {
    char *name;            // what error messages call the template (a file, or "chat_template of <file>")
    ct_body body;
};

void ct_expr_free(ct_expr *e);
void ct_body_free(ct_body *b);

#endif
