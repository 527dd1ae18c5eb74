"""Behaviour of the model and of the Hugging Face mapping that a mutation sweep found no test pinning."""


def test_the_parameter_count_without_the_embedding_leaves_out_its_matrix_once(tiny_model):
    for tied in (True, False):
        model = tiny_model(tie_embeddings=tied)
        embedding = model.token_embedding.weight.numel()  # 65 x 32
        assert model.num_parameters(exclude_embedding=True) == model.num_parameters() - embedding


def test_evaluation_mode_gives_back_the_mode_the_model_was_in(tiny_model):
    from tinyattn.model.transformer import evaluation_mode

    model = tiny_model()  # in eval mode
    for before in (False, True):
        model.train(before)
        with evaluation_mode(model):
            assert not model.training and not model.blocks[0].training
        assert model.training == model.blocks[0].training == before
