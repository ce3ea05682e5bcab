// spm_shim.cc: the C interface (spm.h) over libsentencepiece's C++ SentencePieceProcessor — load a
// .model file, encode to ids, decode ids, look pieces up, normalize. Nothing else of the library is
// used, and no C++ exception or object crosses into the C code.
#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "spm.h"

struct spm_model {
    sentencepiece::SentencePieceProcessor processor;
    // The same model with a character model and no byte fallback (spm_shim_load_normalizer).
    sentencepiece::SentencePieceProcessor normalizer;
};

static void set_message(char *msg, size_t msg_size, const std::string &text) {
    if (msg_size) std::snprintf(msg, msg_size, "%s", text.c_str());
}

extern "C" spm_model *spm_shim_load(const char *path, char *msg, size_t msg_size) {
    try {
        spm_model *m = new spm_model;
        const auto status = m->processor.Load(path);
        if (!status.ok()) {
            set_message(msg, msg_size, status.ToString());
            delete m;
            return nullptr;
        }
        return m;
    } catch (const std::exception &e) {
        set_message(msg, msg_size, e.what());
        return nullptr;
    }
}

extern "C" void spm_shim_free(spm_model *m) { delete m; }

extern "C" int32_t *spm_shim_encode(const spm_model *m, const char *text, size_t n, size_t *count, char *msg,
                                    size_t msg_size) {
    try {
        std::vector<int> ids;
        const auto status = m->processor.Encode(std::string(text, n), &ids);
        if (!status.ok()) {
            set_message(msg, msg_size, status.ToString());
            return nullptr;
        }
        int32_t *out = static_cast<int32_t *>(std::malloc((ids.size() + 1) * sizeof(int32_t)));
        if (!out) return nullptr;
        for (size_t i = 0; i < ids.size(); i++) out[i] = ids[i];
        *count = ids.size();
        return out;
    } catch (const std::exception &e) {
        set_message(msg, msg_size, e.what());
        return nullptr;
    }
}

extern "C" char *spm_shim_decode(const spm_model *m, const int32_t *ids, size_t n, size_t *size, char *msg,
                                 size_t msg_size) {
    try {
        std::vector<int> list(ids, ids + n);
        std::string text;
        const auto status = m->processor.Decode(list, &text);
        if (!status.ok()) {
            set_message(msg, msg_size, status.ToString());
            return nullptr;
        }
        char *out = static_cast<char *>(std::malloc(text.size() + 1));
        if (!out) return nullptr;
        std::memcpy(out, text.data(), text.size());
        out[text.size()] = 0;
        *size = text.size();
        return out;
    } catch (const std::exception &e) {
        set_message(msg, msg_size, e.what());
        return nullptr;
    }
}

extern "C" int32_t spm_shim_piece_count(const spm_model *m) { return m->processor.GetPieceSize(); }

extern "C" const char *spm_shim_piece(const spm_model *m, int32_t id) { return m->processor.IdToPiece(id).c_str(); }

extern "C" int32_t spm_shim_piece_id(const spm_model *m, const char *piece) {
    const int id = m->processor.PieceToId(piece);
    // PieceToId answers the unknown token's id for an absent piece.
    return id == m->processor.unk_id() && m->processor.IdToPiece(id) != piece ? -1 : id;
}

extern "C" int32_t spm_shim_special_id(const spm_model *m, char which) {
    switch (which) {
    case 'b': return m->processor.bos_id();
    case 'e': return m->processor.eos_id();
    case 'u': return m->processor.unk_id();
    case 'p': return m->processor.pad_id();
    default: return -1;
    }
}

extern "C" float spm_shim_score(const spm_model *m, int32_t id) { return m->processor.GetScore(id); }

extern "C" uint8_t *spm_shim_serialized(const spm_model *m, size_t *size) {
    try {
        const std::string bytes = m->processor.serialized_model_proto();
        uint8_t *out = static_cast<uint8_t *>(std::malloc(bytes.size() + 1));
        if (!out) return nullptr;
        std::memcpy(out, bytes.data(), bytes.size());
        *size = bytes.size();
        return out;
    } catch (const std::exception &) {
        return nullptr;
    }
}

// The library (0.1.97) has no public call that only normalizes. A character model splits the
// normalized text into characters, and its pieces are those characters (a run of unknown ones
// merged into one piece of their text, or with byte fallback each of their bytes a <0xXX> piece),
// so their concatenation is the normalized text, at the cost of one pass. Appending a second
// trainer_spec to the serialized model sets its model type: protobuf merges a repeated message.
extern "C" int spm_shim_load_normalizer(spm_model *m, char *msg, size_t msg_size) {
    static const char kCharModel[] = {0x12, 0x02, 0x18, 0x04};  // field 2 (trainer_spec) {field 3 (model_type): CHAR}
    try {
        std::string bytes = m->processor.serialized_model_proto();
        bytes.append(kCharModel, sizeof kCharModel);
        const auto status = m->normalizer.LoadFromSerializedProto(bytes);
        if (!status.ok()) {
            set_message(msg, msg_size, status.ToString());
            return -1;
        }
        return 0;
    } catch (const std::exception &e) {
        set_message(msg, msg_size, e.what());
        return -1;
    }
}

// The byte a <0xXX> piece stands for.
static char byte_of_piece(const std::string &piece) { return char(std::strtol(piece.c_str() + 3, nullptr, 16)); }

extern "C" char *spm_shim_normalize(const spm_model *m, const char *text, size_t n, size_t *size, char *msg,
                                    size_t msg_size) {
    try {
        sentencepiece::ImmutableSentencePieceText spt;
        const auto status = m->normalizer.Encode(absl::string_view(text, n), spt.mutable_proto());
        if (!status.ok()) {
            set_message(msg, msg_size, status.ToString());
            return nullptr;
        }
        std::string normalized;
        normalized.reserve(n + n / 8 + 4);
        for (size_t i = 0; i < spt.pieces_size(); i++) {
            const auto piece = spt.pieces(static_cast<int>(i));
            if (m->normalizer.IsByte(static_cast<int>(piece.id()))) {
                normalized += byte_of_piece(piece.piece());
            } else {
                normalized += piece.piece();
            }
        }
        char *out = static_cast<char *>(std::malloc(normalized.size() + 1));
        if (!out) return nullptr;
        std::memcpy(out, normalized.data(), normalized.size() + 1);
        *size = normalized.size();
        return out;
    } catch (const std::exception &e) {
        set_message(msg, msg_size, e.what());
        return nullptr;
    }
}
