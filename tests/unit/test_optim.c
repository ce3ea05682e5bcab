// test_optim.c: the learning-rate schedule against values of GPT-NeoX's AnnealingLR formula
// (computed in Python from megatron/learning_rates.py's definition, lr=6e-4, min_lr=6e-5), the
// cosine hold at min_lr past the decay, and DeepSpeed's dynamic loss-scaling rules.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>

#include "optim.h"

typedef struct {
    const char *style;
    double warmup_fraction;
    int64_t decay_iters, iteration;
    double expected;
} lr_case;

static const lr_case lr_cases[] = {
    {"constant", 0.01, 1000, 0, 0},
    {"constant", 0.01, 1000, 1, 5.9999999999999995e-05},
    {"constant", 0.01, 1000, 2, 0.00011999999999999999},
    {"constant", 0.01, 1000, 3, 0.00017999999999999998},
    {"constant", 0.01, 1000, 5, 0.00029999999999999997},
    {"constant", 0.01, 1000, 9, 0.0005399999999999999},
    {"constant", 0.01, 1000, 10, 0.00059999999999999995},
    {"constant", 0.01, 1000, 11, 0.00059999999999999995},
    {"constant", 0.01, 1000, 25, 0.00059999999999999995},
    {"constant", 0.01, 1000, 36, 0.00059999999999999995},
    {"constant", 0.01, 1000, 37, 0.00059999999999999995},
    {"constant", 0.01, 1000, 49, 0.00059999999999999995},
    {"constant", 0.01, 1000, 50, 0.00059999999999999995},
    {"constant", 0.01, 1000, 200, 0.00059999999999999995},
    {"constant", 0.01, 1000, 989, 0.00059999999999999995},
    {"constant", 0.01, 1000, 990, 0.00059999999999999995},
    {"constant", 0.01, 1000, 999, 0.00059999999999999995},
    {"constant", 0.01, 1000, 1000, 0.00059999999999999995},
    {"constant", 0.1, 37, 0, 0},
    {"constant", 0.1, 37, 1, 0.00016216216216216213},
    {"constant", 0.1, 37, 2, 0.00032432432432432425},
    {"constant", 0.1, 37, 3, 0.00048648648648648646},
    {"constant", 0.1, 37, 5, 0.00059999999999999995},
    {"constant", 0.1, 37, 9, 0.00059999999999999995},
    {"constant", 0.1, 37, 10, 0.00059999999999999995},
    {"constant", 0.1, 37, 11, 0.00059999999999999995},
    {"constant", 0.1, 37, 25, 0.00059999999999999995},
    {"constant", 0.1, 37, 36, 0.00059999999999999995},
    {"constant", 0.1, 37, 37, 0.00059999999999999995},
    {"constant", 0.0, 50, 0, 0.00059999999999999995},
    {"constant", 0.0, 50, 1, 0.00059999999999999995},
    {"constant", 0.0, 50, 2, 0.00059999999999999995},
    {"constant", 0.0, 50, 3, 0.00059999999999999995},
    {"constant", 0.0, 50, 5, 0.00059999999999999995},
    {"constant", 0.0, 50, 9, 0.00059999999999999995},
    {"constant", 0.0, 50, 10, 0.00059999999999999995},
    {"constant", 0.0, 50, 11, 0.00059999999999999995},
    {"constant", 0.0, 50, 25, 0.00059999999999999995},
    {"constant", 0.0, 50, 36, 0.00059999999999999995},
    {"constant", 0.0, 50, 37, 0.00059999999999999995},
    {"constant", 0.0, 50, 49, 0.00059999999999999995},
    {"constant", 0.0, 50, 50, 0.00059999999999999995},
    {"linear", 0.01, 1000, 0, 0},
    {"linear", 0.01, 1000, 1, 5.9999999999999995e-05},
    {"linear", 0.01, 1000, 2, 0.00011999999999999999},
    {"linear", 0.01, 1000, 3, 0.00017999999999999998},
    {"linear", 0.01, 1000, 5, 0.00029999999999999997},
    {"linear", 0.01, 1000, 9, 0.0005399999999999999},
    {"linear", 0.01, 1000, 10, 0.00059999999999999995},
    {"linear", 0.01, 1000, 11, 0.00059939999999999993},
    {"linear", 0.01, 1000, 25, 0.00059099999999999995},
    {"linear", 0.01, 1000, 36, 0.00058439999999999989},
    {"linear", 0.01, 1000, 37, 0.00058379999999999999},
    {"linear", 0.01, 1000, 49, 0.00057660000000000003},
    {"linear", 0.01, 1000, 50, 0.00057599999999999991},
    {"linear", 0.01, 1000, 200, 0.00048599999999999994},
    {"linear", 0.01, 1000, 989, 6.0000000000000002e-05},
    {"linear", 0.01, 1000, 990, 6.0000000000000002e-05},
    {"linear", 0.01, 1000, 999, 6.0000000000000002e-05},
    {"linear", 0.01, 1000, 1000, 6.0000000000000002e-05},
    {"linear", 0.1, 37, 0, 0},
    {"linear", 0.1, 37, 1, 0.00016216216216216213},
    {"linear", 0.1, 37, 2, 0.00032432432432432425},
    {"linear", 0.1, 37, 3, 0.00048648648648648646},
    {"linear", 0.1, 37, 5, 0.00057891891891891892},
    {"linear", 0.1, 37, 9, 0.00051405405405405399},
    {"linear", 0.1, 37, 10, 0.00049783783783783784},
    {"linear", 0.1, 37, 11, 0.00048162162162162158},
    {"linear", 0.1, 37, 25, 0.00025459459459459456},
    {"linear", 0.1, 37, 36, 0.00012000000000000003},
    {"linear", 0.1, 37, 37, 0.00012000000000000003},
    {"linear", 0.0, 50, 0, 0.00059999999999999995},
    {"linear", 0.0, 50, 1, 0.00058799999999999998},
    {"linear", 0.0, 50, 2, 0.00057600000000000001},
    {"linear", 0.0, 50, 3, 0.00056399999999999994},
    {"linear", 0.0, 50, 5, 0.0005399999999999999},
    {"linear", 0.0, 50, 9, 0.00049199999999999992},
    {"linear", 0.0, 50, 10, 0.00047999999999999996},
    {"linear", 0.0, 50, 11, 0.00046799999999999994},
    {"linear", 0.0, 50, 25, 0.00029999999999999997},
    {"linear", 0.0, 50, 36, 0.00016799999999999999},
    {"linear", 0.0, 50, 37, 0.000156},
    {"linear", 0.0, 50, 49, 6.0000000000000002e-05},
    {"linear", 0.0, 50, 50, 6.0000000000000002e-05},
    {"cosine", 0.01, 1000, 0, 0},
    {"cosine", 0.01, 1000, 1, 5.9999999999999995e-05},
    {"cosine", 0.01, 1000, 2, 0.00011999999999999999},
    {"cosine", 0.01, 1000, 3, 0.00017999999999999998},
    {"cosine", 0.01, 1000, 5, 0.00029999999999999997},
    {"cosine", 0.01, 1000, 9, 0.0005399999999999999},
    {"cosine", 0.01, 1000, 10, 0.00059999999999999995},
    {"cosine", 0.01, 1000, 11, 0.00059999851956055747},
    {"cosine", 0.01, 1000, 25, 0.000599666962488591},
    {"cosine", 0.01, 1000, 36, 0.00059899977841020892},
    {"cosine", 0.01, 1000, 37, 0.00059892140569337764},
    {"cosine", 0.01, 1000, 49, 0.00059775106522404707},
    {"cosine", 0.01, 1000, 50, 0.00059763441039434339},
    {"cosine", 0.01, 1000, 200, 0.00054812417228236848},
    {"cosine", 0.01, 1000, 989, 6.0000000000000002e-05},
    {"cosine", 0.01, 1000, 990, 6.0000000000000002e-05},
    {"cosine", 0.01, 1000, 999, 6.0000000000000002e-05},
    {"cosine", 0.01, 1000, 1000, 6.0000000000000002e-05},
    {"cosine", 0.1, 37, 0, 0},
    {"cosine", 0.1, 37, 1, 0.00016216216216216213},
    {"cosine", 0.1, 37, 2, 0.00032432432432432425},
    {"cosine", 0.1, 37, 3, 0.00048648648648648646},
    {"cosine", 0.1, 37, 5, 0.00059817428379872392},
    {"cosine", 0.1, 37, 9, 0.00057013257516512657},
    {"cosine", 0.1, 37, 10, 0.00055809285010840343},
    {"cosine", 0.1, 37, 11, 0.00054419356015246543},
    {"cosine", 0.1, 37, 25, 0.00022934733485907669},
    {"cosine", 0.1, 37, 36, 6.0000000000000002e-05},
    {"cosine", 0.1, 37, 37, 6.0000000000000002e-05},
    {"cosine", 0.0, 50, 0, 0.00059999999999999995},
    {"cosine", 0.0, 50, 1, 0.00059940801852848143},
    {"cosine", 0.0, 50, 2, 0.00059763441039434339},
    {"cosine", 0.0, 50, 3, 0.00059468617521860664},
    {"cosine", 0.0, 50, 5, 0.00058531695488854606},
    {"cosine", 0.0, 50, 9, 0.0005532983776506045},
    {"cosine", 0.0, 50, 10, 0.00054270509831248423},
    {"cosine", 0.0, 50, 11, 0.00053115397283273671},
    {"cosine", 0.0, 50, 25, 0.00029999999999999997},
    {"cosine", 0.0, 50, 36, 0.00010877280307539307},
    {"cosine", 0.0, 50, 37, 9.4635868221393371e-05},
    {"cosine", 0.0, 50, 49, 6.0000000000000002e-05},
    {"cosine", 0.0, 50, 50, 6.0000000000000002e-05},
    {"exponential", 0.01, 1000, 0, 0},
    {"exponential", 0.01, 1000, 1, 5.9999999999999995e-05},
    {"exponential", 0.01, 1000, 2, 0.00011999999999999999},
    {"exponential", 0.01, 1000, 3, 0.00017999999999999998},
    {"exponential", 0.01, 1000, 5, 0.00029999999999999997},
    {"exponential", 0.01, 1000, 9, 0.0005399999999999999},
    {"exponential", 0.01, 1000, 10, 0.00059999999999999995},
    {"exponential", 0.01, 1000, 11, 0.00059958434404142448},
    {"exponential", 0.01, 1000, 25, 0.00059379530477455882},
    {"exponential", 0.01, 1000, 36, 0.00058928601217129637},
    {"exponential", 0.01, 1000, 37, 0.00058887777843418942},
    {"exponential", 0.01, 1000, 49, 0.00058400097667536145},
    {"exponential", 0.01, 1000, 50, 0.00058359640419907983},
    {"exponential", 0.01, 1000, 200, 0.00052597814119785947},
    {"exponential", 0.01, 1000, 989, 0.00030444262788169562},
    {"exponential", 0.01, 1000, 990, 0.00030423172222782325},
    {"exponential", 0.01, 1000, 999, 0.00030423172222782325},
    {"exponential", 0.01, 1000, 1000, 0.00030423172222782325},
    {"exponential", 0.1, 37, 0, 0},
    {"exponential", 0.1, 37, 1, 0.00016216216216216213},
    {"exponential", 0.1, 37, 2, 0.00032432432432432425},
    {"exponential", 0.1, 37, 3, 0.00048648648648648646},
    {"exponential", 0.1, 37, 5, 0.00058556723303654779},
    {"exponential", 0.1, 37, 9, 0.00054330023584174656},
    {"exponential", 0.1, 37, 10, 0.00053321907269945185},
    {"exponential", 0.1, 37, 11, 0.00052332496975628269},
    {"exponential", 0.1, 37, 25, 0.00040261727141413804},
    {"exponential", 0.1, 37, 36, 0.0003446500847440983},
    {"exponential", 0.1, 37, 37, 0.0003446500847440983},
    {"exponential", 0.0, 50, 0, 0.00059999999999999995},
    {"exponential", 0.0, 50, 1, 0.00059174136454995935},
    {"exponential", 0.0, 50, 2, 0.00058359640419907983},
    {"exponential", 0.0, 50, 3, 0.00057556355427868856},
    {"exponential", 0.0, 50, 5, 0.00055982803444180765},
    {"exponential", 0.0, 50, 9, 0.00052963582896614874},
    {"exponential", 0.0, 50, 10, 0.00052234571357829629},
    {"exponential", 0.0, 50, 11, 0.00051515594219940552},
    {"exponential", 0.0, 50, 25, 0.00042429529157236276},
    {"exponential", 0.0, 50, 36, 0.00036429706783455338},
    {"exponential", 0.0, 50, 37, 0.00035928274003661293},
    {"exponential", 0.0, 50, 49, 0.00030423172222782325},
    {"exponential", 0.0, 50, 50, 0.00030004415741746059},
};

static void test_lr_matches_gpt_neox_formula(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof lr_cases / sizeof *lr_cases; i++) {
        const lr_case *c = &lr_cases[i];
        neox_lr_style style;
        assert_int_equal(neox_lr_style_parse(c->style, &style), 0);
        neox_lr_schedule s = neox_lr_schedule_make(6e-4, 6e-5, c->warmup_fraction, c->decay_iters, style);
        double got = neox_lr_at(&s, c->iteration);
        if (fabs(got - c->expected) > 1e-15 * fmax(1.0, fabs(c->expected)))
            fail_msg("%s warmup %g decay %lld iteration %lld: got %.17g, want %.17g", c->style, c->warmup_fraction,
                     (long long)c->decay_iters, (long long)c->iteration, got, c->expected);
    }
}

static void test_cosine_holds_min_lr_after_decay(void **state) {
    (void)state;
    neox_lr_schedule s = neox_lr_schedule_make(1e-3, 1e-5, 0.01, 100, NEOX_LR_COSINE);
    for (int64_t it = 101; it < 400; it += 7) assert_true(neox_lr_at(&s, it) == 1e-5);
    // Linear keeps GPT-NeoX's value past the end (it is clamped, not rising).
    neox_lr_schedule lin = neox_lr_schedule_make(1e-3, 0, 0.01, 100, NEOX_LR_LINEAR);
    assert_true(neox_lr_at(&lin, 500) == neox_lr_at(&lin, 100));
}

static void test_unknown_style_rejected(void **state) {
    (void)state;
    neox_lr_style style;
    assert_int_equal(neox_lr_style_parse("cosine_restarts", &style), -1);
    neox_lr_schedule s = neox_lr_schedule_make(1, 0, 0, 0, NEOX_LR_LINEAR);
    assert_int_equal(s.decay_iters, 1);  // GPT-NeoX: max(1, num_iters)
}

// DeepSpeed semantics with hysteresis 2 and window 3 from 2^4.
static void test_dynamic_loss_scaler(void **state) {
    (void)state;
    neox_loss_scaler s = neox_loss_scaler_dynamic(4, 3, 2, 1.0, 0);
    assert_true(s.scale == 16);
    neox_loss_scaler_update(&s, 0);  // iteration 0: (0 - -1) % 3 != 0
    assert_true(s.scale == 16);
    neox_loss_scaler_update(&s, 0);  // 1
    neox_loss_scaler_update(&s, 0);  // 2: (2 - -1) % 3 == 0 -> doubles
    assert_true(s.scale == 32);
    neox_loss_scaler_update(&s, 1);  // first overflow absorbed by hysteresis
    assert_true(s.scale == 32);
    neox_loss_scaler_update(&s, 1);  // second halves
    assert_true(s.scale == 16);
    neox_loss_scaler_update(&s, 1);  // hysteresis is not refilled until growth: halves again
    assert_true(s.scale == 8);
    neox_loss_scaler_update(&s, 0);  // iterations 6, 7 clean; 8 - 5 == 3 -> doubles, refills
    neox_loss_scaler_update(&s, 0);
    assert_true(s.scale == 8);
    neox_loss_scaler_update(&s, 0);
    assert_true(s.scale == 16);
    assert_int_equal(s.hysteresis_left, 2);
}

static void test_loss_scaler_floor_reports_stuck(void **state) {
    (void)state;
    neox_loss_scaler s = neox_loss_scaler_dynamic(1, 1000, 1, 1.0, 0);
    assert_int_equal(neox_loss_scaler_update(&s, 1), 0);  // 2 -> 1
    assert_true(s.scale == 1);
    assert_int_equal(neox_loss_scaler_update(&s, 1), 1);  // already at the floor
    assert_true(s.scale == 1);
    neox_loss_scaler fixed = neox_loss_scaler_static(128);
    assert_int_equal(neox_loss_scaler_update(&fixed, 1), 0);
    assert_true(fixed.scale == 128);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lr_matches_gpt_neox_formula),
        cmocka_unit_test(test_cosine_holds_min_lr_after_decay),
        cmocka_unit_test(test_unknown_style_rejected),
        cmocka_unit_test(test_dynamic_loss_scaler),
        cmocka_unit_test(test_loss_scaler_floor_reports_stuck),
    };
    return cmocka_run_group_tests_name("optim", tests, NULL, NULL);
}
